"""One bound on a command's work: every simulation it will run, counted before the first.

A run's size is its decode batch steps (checks.batch_steps, scenario_steps). A command
that runs more than its one scenario (prediction intervals from an ensemble, a
sensitivity tornado, validate / diagnose / fit over a profile's measured points) adds
each run it will make to one `Work` and checks the total before it starts: a single
prediction's runs together within MAX_BATCH_STEPS (a minute or two of simulation), the
commands that run many scenarios by design (validate, diagnose, fit, as a sweep does:
explore/grid.py) within MAX_SWEEP_BATCH_STEPS. Over the bound: one line saying how many
runs, of what, how much work, and how to go round it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..base.checks import MAX_BATCH_STEPS
from ..base.errors import require

if TYPE_CHECKING:
    from .build import Scenario


@dataclass
class Work:
    """The runs a command will make, by kind: label -> (runs, decode batch steps)."""

    what: str  # "this prediction", "validate", ...
    hint: str  # how to go round the bound
    limit: float = MAX_BATCH_STEPS
    parts: dict[str, tuple[int, float]] = field(default_factory=dict)

    def add(self, label: str, scenarios: Scenario | Iterable[Scenario], times: int = 1) -> Work:
        """`scenarios`' runs, each made `times` times (an optimiser's evaluations)."""
        from .build import Scenario, scenario_steps

        runs, steps = self.parts.get(label, (0, 0.0))
        for sc in [scenarios] if isinstance(scenarios, Scenario) else scenarios:
            runs += times
            steps += times * scenario_steps(sc)[0]
        self.parts[label] = (runs, steps)
        return self

    @property
    def runs(self) -> int:
        return sum(r for r, _ in self.parts.values())

    @property
    def steps(self) -> float:
        return sum(s for _, s in self.parts.values())

    def check(self) -> None:
        shown = "; ".join(f"{label}: {r:,} x {s / max(r, 1):,.0f}" for label, (r, s) in self.parts.items())
        require(
            self.steps <= self.limit,
            f"{self.what} runs {self.runs:,} simulations needing about {self.steps:,.0f} decode batch steps "
            f"together ({shown}), above the limit of {self.limit:,.0f} "
            f"({'a minute or two' if self.limit <= MAX_BATCH_STEPS else 'hours'} of simulation); {self.hint}",
        )

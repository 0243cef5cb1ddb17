"""What no measurement behind a band has checked, and how much wider the band is for it
(docs/uncertainty.md, "Unchecked features").

A band's calibration part rests on the profile's measured end-to-end points
(measured.csv: TP x PP runs of one node, no data or expert parallel) and, for the
share priced by the roofline, on the public corpus's residuals (GPUs whose tables the
roofline's curves were fitted on). An answer that needs something neither has seen
(data parallel ranks, expert parallel, several nodes, a GPU of which no table was measured
anywhere: no profile's tables, no AIConfigurator system)
rests on rules no measurement has confirmed. Such an answer says so, and each such
feature widens the band by the stated default (uncertainty.DEFAULT_CALIBRATION_REL:
the size of an error off the measured points) in quadrature with the other parts. The
rule is stated, not fitted: no measurement exists to fit it to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..scenario.build import Scenario


@dataclass(frozen=True)
class Unchecked:
    """One feature of a scenario that no measurement behind its band has checked."""

    feature: str
    why: str


def unchecked(scenario: Scenario) -> tuple[Unchecked, ...]:
    """The features of `scenario` no measured point of its profile, nor the corpus
    residuals, has checked (module docstring)."""
    plan, box, prof = scenario.plan, scenario.box, scenario.profile
    measured = prof.measured
    out = []
    if plan.dp > 1 and not any(getattr(p, "dp", 1) > 1 for p in measured):
        out.append(Unchecked(f"data parallel (DP{plan.dp})", "no measured point of the profile has DP ranks"))
    if plan.ep > 1 and not any(getattr(p, "ep", 1) > 1 for p in measured):
        out.append(Unchecked(f"expert parallel (EP{plan.ep})", "no measured point of the profile has EP"))
    nodes = getattr(box, "nodes", 1)
    if nodes > 1 and not any(getattr(p, "nodes", 1) > 1 for p in measured):
        out.append(Unchecked(f"{nodes} nodes", "no measured point of the profile spans nodes"))
    if not prof.tables and not box.aiconfigurator_system:
        out.append(
            Unchecked(
                f"a GPU without tables ({box.gpu.name})",
                "no kernel of this GPU was measured anywhere; the corpus residuals are of GPUs the "
                "roofline's curves were fitted on",
            )
        )
    return tuple(out)


def text(features: tuple[Unchecked, ...], rel: float) -> str:
    """One line for the table: what is unchecked and how much it widens the band."""
    names = ", ".join(u.feature for u in features)
    return (
        f"unchecked: {names} (no measurement behind this band has them): the band widened by "
        f"{rel:.0%} for each, in quadrature"
    )

"""How many requests an engine runs at once: the one rule the run's length
(sim/runner.py), the bound on a run's work (build.scenario_steps), a sweep's cap
columns (explore/sweep.py) and an ensemble member's size (report/uncertainty.py) all
take, so that they cannot disagree.

Three things bound the running requests (docs/engines.md §4, §8): the engine's running
cap (SGLang `max_running_requests`, vLLM `max_num_seqs`), SGLang's per-slot cap times
its micro-batch slots (a request stays in its slot, so no more fit), and the KV cache
(the requests it holds whole). A closed loop's clients beyond the smallest only queue.
With DP ranks each rank has its own caps and KV pool: the engine runs dp times them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the scenario's parts, not the Scenario: build.py's work bound calls in here
    from ..engines.protocol import EngineSettings
    from ..inputs.workload import Workload

# how a request's KV footprint is counted: "mean" (input + output at their mean: the
# engines take KV as a request grows, so the requests in flight hold about that; the
# run's estimate) or "max" (every request at its largest, as it is when it finishes:
# the sure bound, for the work bound and a sweep's columns)
LENGTHS = ("mean", "max")


@dataclass(frozen=True)
class Admission:
    """The bounds on the requests an engine runs at once, each for all its DP ranks."""

    running_cap: int  # the engine's running cap x dp
    slot_cap: int  # SGLang's per-slot cap x slots x dp; 0: the engine has no slots
    kv_requests: int  # the requests the KV cache holds whole x dp
    kv_tokens: int  # one rank's KV pool, as the engine runs it (tokens)
    request_tokens: float  # one request's KV footprint, as `lengths` counts it
    clients: int  # a closed loop's concurrency C; 0: an open loop or a trace

    def bounds(self) -> dict[str, int]:
        """Each bound by name, in the order a tie is reported."""
        out = {"running cap": self.running_cap}
        if self.slot_cap:
            out["per-slot cap x slots"] = self.slot_cap
        out["KV cache"] = self.kv_requests
        return out

    @property
    def cap(self) -> int:
        """The engine's cap: the smallest bound (at least 1)."""
        return max(1, min(self.bounds().values()))

    @property
    def reason(self) -> str:
        """The name of the bound that sets `cap` (the first of a tie)."""
        b = self.bounds()
        return min(b, key=lambda k: b[k])

    @property
    def admitted(self) -> int:
        """The requests of a closed loop running at once: C unless the cap is smaller
        (at mean lengths an estimate: the engines take KV as requests grow and evict
        when it runs out). Clients beyond it only queue. An open loop: the cap."""
        return max(1, min(self.clients, self.cap)) if self.clients else self.cap


def admission(workload: Workload, settings: EngineSettings, dp: int = 1, lengths: str = "mean") -> Admission:
    """The bounds of an engine run with `settings` on `dp` ranks under `workload` (a
    scenario's parts), its KV cache counted at `lengths` (LENGTHS)."""
    if lengths not in LENGTHS:
        raise ValueError(f"lengths must be one of {', '.join(LENGTHS)}, got {lengths!r}")
    w, s = workload, settings
    if lengths == "mean":
        per_request = max(1.0, w.input_len.mean + w.output_len.mean)
    else:
        per_request = float(w.max_request_tokens)
    return Admission(
        running_cap=s.running_cap * dp,
        slot_cap=s.slot_cap * s.slots * dp,
        kv_requests=int(s.kv_tokens // per_request) * dp,
        kv_tokens=s.kv_tokens,
        request_tokens=per_request,
        clients=w.concurrency if w.kind == "closed" else 0,
    )

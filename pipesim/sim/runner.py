"""One run of a built scenario: the horizon (warm-up and measured requests, the stopping
rule), the simulation the plan needs, and its `Result`. `api.py` builds on it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict

from ..base.checks import MAX_SIM_S
from ..base.errors import UserError, require
from ..costs.stage import CostModel
from ..measure.metrics import Result, collect
from ..measure.record import Record
from ..scenario.admission import admission
from ..scenario.build import Scenario
from .simulation import RECORD_MODES, Simulation

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

# A run stops at the request target; MAX_SIM_S, a bound on simulated time, only
# guards against a scenario that cannot make progress.
CI_TARGET = 0.02  # stop when the throughput's 95% CI half-width is within 2% of it


class SimulateKeywords(TypedDict, total=False):
    """`simulate`'s keywords beside the scenario: what `run` and api.py pass on."""

    warmup_requests: int | None
    measure_requests: int | None
    max_measure_requests: int | None
    ci_target: float | None
    record: str
    progress: Callable[[int, int], None] | None


def run(scenario: Scenario, **kwargs: Unpack[SimulateKeywords]) -> Result:
    """Simulate a built scenario and return its metrics (see `simulate`)."""
    return simulate(scenario, **kwargs)[1]


def admitted_concurrency(scenario: Scenario) -> int:
    """How many of a closed loop's C requests the engine runs at once (the scenario
    layer's one rule, scenario/admission.py)."""
    return admission(scenario.workload, scenario.settings, scenario.plan.dp).admitted


def simulate(
    scenario: Scenario,
    *,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    max_measure_requests: int | None = None,
    ci_target: float | None = CI_TARGET,
    record: str = "summary",
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Record, Result]:
    """Simulate a built scenario; returns what the run recorded (its figures feed the
    idle breakdown; with `record="full"` every row too, for the trace, and every
    request) and the metrics.

    Closed loop: the first A completed requests are warm-up, A the requests the engine
    admits at once (`admitted_concurrency`: C unless its running cap or KV capacity is
    smaller; more clients only lengthen the queue, not the work in flight, so they
    need no longer a run). The run then measures at
    least `measure_requests` completions (default max(2A, 16)) while every client keeps
    its next request coming, and goes on until the throughput's 95% confidence
    half-width (batch means) is within `ci_target` of the mean, or
    `max_measure_requests` (default 20x the minimum) have completed. `ci_target=None`
    measures exactly `measure_requests`. Open loop and traces: every request.

    `record`: "summary" (the default) folds the run's rows into running figures as it
    goes and keeps an open loop's requests only as running figures, so memory does
    not grow with the run (tally.py, request_tally.py); "full" keeps every row and
    request (the numbers are the same). `progress`, if given, is told (requests
    finished, requests the run expects to need) as requests finish (a progress bar).
    """
    if record not in RECORD_MODES:
        raise UserError(f"record {record!r} is not one of {', '.join(RECORD_MODES)}")
    w = scenario.workload
    plan = scenario.plan
    require(
        plan.dp == 1 or plan.pp == 1,
        f"{plan.label()}: data parallel ranks are simulated without pipeline stages; use --pp 1 with --dp > 1",
    )
    queued = False
    if w.kind == "closed":
        admitted = admitted_concurrency(scenario)
        queued = admitted < w.concurrency
        warm = admitted if warmup_requests is None else warmup_requests
        measure = max(2 * admitted, 16) if measure_requests is None else measure_requests
        cap = 20 * measure if max_measure_requests is None else max_measure_requests
    else:
        warm, measure, cap, ci_target = 0, w.num_requests, w.num_requests, None
    t = time.perf_counter()
    costs = CostModel(scenario.box, scenario.model, scenario.plan, scenario.profile)
    sim = Simulation(
        costs,
        w,
        scenario.settings.scheduler,
        scenario.settings,
        warm,
        measure,
        max_measure_requests=cap,
        ci_target=ci_target,
        queued=queued,
        record=record,
        on_progress=progress,
    )
    sim.run(MAX_SIM_S)
    rec = sim.record()
    result = collect(
        rec,
        scenario.describe(),
        time.perf_counter() - t,
        provenance_shares=costs.provenance_shares(),
        data_parallel=sim.summary(),
    )
    _check_completed(result, rec.requests.finished, rec.end_s, scenario)
    return rec, result


def _check_completed(result: Result, finished: int, end_s: float, scenario: Scenario) -> None:
    """A run that completed no request (in its measured window) has no answer: say why
    instead of reporting 0 tok/s."""
    if result.completed_requests > 0:
        return
    why = (
        f"the run reached the simulated horizon of {MAX_SIM_S:g} s"
        if end_s >= MAX_SIM_S
        else f"the run ended at {end_s:.3g} s simulated"
    )
    if finished and scenario.workload.kind == "closed":
        why += " before its warm-up was over"
    raise UserError(
        f"the run completed no request ({finished} finished in all; {why}): a latency or parameter of "
        f"profile {scenario.profile.name} may be infinite or huge, or the arrivals lie past the horizon; "
        "check the profile's tables and parameters and the workload"
    )

"""The Python API: `predict(...)` runs one scenario and returns its `Result`."""

from __future__ import annotations

import time

from .costs import CostModel
from .metrics import Result, collect
from .scenario import Scenario, build_scenario
from .simulation import Simulation

# A run stops at the request target; this bound on simulated time only guards
# against a scenario that cannot make progress.
MAX_SIM_S = 1e6


def run(scenario: Scenario, *, warmup_requests: int | None = None, measure_requests: int | None = None) -> Result:
    """Simulate a built scenario.

    Closed loop: the first C completed requests are warm-up; the run then measures
    until `measure_requests` more complete (default max(2C, 16)) while every client
    keeps its next request coming. Open loop and traces: every request, no warm-up.
    """
    w = scenario.workload
    if w.kind == "closed":
        warm = w.concurrency if warmup_requests is None else warmup_requests
        measure = max(2 * w.concurrency, 16) if measure_requests is None else measure_requests
    else:
        warm, measure = 0, w.num_requests
    t = time.perf_counter()
    costs = CostModel(scenario.box, scenario.model, scenario.plan, scenario.profile)
    sim = Simulation(costs, w, scenario.settings.scheduler, scenario.settings, warm, measure)
    sim.run(MAX_SIM_S)
    return collect(sim, scenario.describe(), time.perf_counter() - t)


def predict(tp: int = 1, pp: int = 1, conc: int | None = None, *, warmup_requests: int | None = None,
            measure_requests: int | None = None, **kwargs) -> Result:
    """Predict one scenario. Keyword arguments are those of `build_scenario`
    (model, profile, engine, box, layers, rate_rps, num_requests, trace, input_len,
    output_len, seed) and the engine's knobs (e.g. max_running_requests)."""
    scenario = build_scenario(tp=tp, pp=pp, concurrency=conc, **kwargs)
    return run(scenario, warmup_requests=warmup_requests, measure_requests=measure_requests)

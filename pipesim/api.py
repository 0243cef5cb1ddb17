"""The Python API: `predict(...)` runs one scenario and returns its `Result`;
`whatif(...)` predicts a scenario and its changed copy. `run` and `simulate` (a built
scenario) are runner.py's."""

from __future__ import annotations

from .measure.metrics import Result
from .scenario.build import build_scenario
from .scenario.whatif import check
from .sim.runner import CI_TARGET, admitted_concurrency, run, simulate

__all__ = ["CI_TARGET", "admitted_concurrency", "predict", "run", "simulate", "whatif"]


def predict(
    tp: int = 1,
    pp: int = 1,
    conc: int | None = None,
    *,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    max_measure_requests: int | None = None,
    ci_target: float | None = CI_TARGET,
    intervals: bool = False,
    ensemble: bool = False,
    record: str = "summary",
    **kwargs: object,
) -> Result:
    """Predict one scenario. Keyword arguments are those of `build_scenario`
    (model, profile, engine, box, layers, rate_rps, num_requests, trace, input_len,
    output_len, seed) and the engine's knobs (e.g. max_running_requests).
    `intervals=True` adds prediction intervals (pipesim.report.uncertainty), their workload
    part from the run itself; `ensemble=True` takes it from a few short runs more.
    `record="full"` keeps an open loop's requests (`Result.requests`; a closed loop's
    are always kept) at memory that grows with them (runner.simulate)."""
    scenario = build_scenario(tp=tp, pp=pp, concurrency=conc, **kwargs)
    result = run(
        scenario,
        warmup_requests=warmup_requests,
        measure_requests=measure_requests,
        max_measure_requests=max_measure_requests,
        ci_target=ci_target,
        record=record,
    )
    if intervals:
        from .report.uncertainty import attach

        result = attach(result, scenario, "ensemble" if ensemble else "run")
    return result


def whatif(base: dict, **changes: float) -> tuple[Result, Result]:
    """Predict `base` (the keyword arguments of `pipesim.predict`) and the same with
    `changes` (what-if knobs, whatif.KNOBS) on top: (base result, changed result)."""
    check(changes)
    return predict(**base), predict(**{**base, **changes})

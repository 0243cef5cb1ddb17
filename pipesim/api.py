"""The Python API, and the one place a prediction is put together: the scenario built
(scenario/build.py), run (sim/runner.py), its intervals added (report/uncertainty.py).
The command line, explore and calibrate reach the simulation only through here, so a
prediction is the same whoever asks for it.

`predict(...)` builds and runs one scenario from keywords; `run(scenario)` runs a built
one, and `simulate(scenario)` hands back what the run recorded too; `trace(...)` keeps
every row for the Perfetto trace; `sensitivity(scenario)` is the tornado; `whatif(...)`
predicts a scenario and its changed copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

from .base.errors import UserError, require
from .measure.metrics import Result
from .report import sensitivity as tornado
from .report.uncertainty import WORKLOAD_METHODS, attach, ensemble_scenarios, takes_ensemble
from .scenario.aliases import canonical
from .scenario.build import build_scenario
from .scenario.whatif import check
from .scenario.work import Work
from .sim.runner import CI_TARGET
from .sim.runner import simulate as run_scenario

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

    from .base.progress import RequestBar
    from .measure.record import Record
    from .scenario.build import Scenario

__all__ = ["CI_TARGET", "RUN_KEYS", "predict", "run", "sensitivity", "simulate", "trace", "whatif"]

# the keywords that set a closed loop's run length (simulate), beside a scenario's own
RUN_KEYS = ("warmup_requests", "measure_requests", "max_measure_requests", "ci_target")
# intervals: None (none), else how their workload part is estimated
INTERVALS = (None, *WORKLOAD_METHODS)


class RunKeywords(TypedDict, total=False):
    """`simulate`'s keywords beside the scenario (what `run` passes on): the run's length,
    what is kept, the intervals and the progress bar."""

    warmup_requests: int | None
    measure_requests: int | None
    max_measure_requests: int | None
    ci_target: float | None
    record: str
    intervals: str | None
    progress: bool | None


def _bar(scenario: Scenario, progress: bool | None) -> RequestBar | None:
    """A bar over the run's requests (base/progress.py), drawn once the work has taken
    two seconds; None where none may be drawn (asked not to, or `progress=None` and
    stderr is no terminal: tqdm is then not even imported)."""
    import sys

    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    from .base.progress import RequestBar

    w = scenario.workload
    load = (
        f"C={w.concurrency}"
        if w.kind == "closed"
        else f"{w.rate_rps:g} req/s"
        if w.kind == "poisson"
        else "trace"
    )
    return RequestBar(f"simulating {scenario.plan.label()} {load}", progress)


def simulate(
    scenario: Scenario,
    *,
    intervals: str | None = None,
    record: str = "summary",
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    max_measure_requests: int | None = None,
    ci_target: float | None = CI_TARGET,
    progress: bool | None = False,
) -> tuple[Record, Result]:
    """Run a built scenario: what the run recorded (its rows too with `record="full"`)
    and its Result. `intervals` adds prediction intervals, their workload part from the
    run itself ("run"; an open loop's takes the ensemble), from a few short runs more
    ("ensemble"), or left out ("none"): docs/uncertainty.md. The run-length keywords
    are sim.runner.simulate's (warm-up, measured requests, the stopping rule).
    `progress`: a bar over the run's requests (None: on a terminal, once it has taken
    two seconds; off by default here, where a sweep's workers run scenarios by the
    thousand)."""
    require(
        intervals in INTERVALS,
        f"intervals {intervals!r} is not one of None, {', '.join(map(repr, INTERVALS[1:]))}",
    )
    work = Work("this prediction", "use --no-intervals (the run alone), fewer requests or shorter outputs")
    work.add("the run", scenario)
    if intervals is not None and takes_ensemble(scenario, intervals):
        work.add("the interval's ensemble", ensemble_scenarios(scenario))
    work.check()
    bar = _bar(scenario, progress)
    try:
        rec, result = run_scenario(
            scenario,
            warmup_requests=warmup_requests,
            measure_requests=measure_requests,
            max_measure_requests=max_measure_requests,
            ci_target=ci_target,
            record=record,
            progress=bar.tick if bar else None,
        )
        if intervals is not None:
            result = attach(result, scenario, intervals)
    finally:
        if bar:
            bar.close()
    return rec, result


def run(scenario: Scenario, **kwargs: Unpack[RunKeywords]) -> Result:
    """Run a built scenario and return its Result (the keywords of `simulate`)."""
    return simulate(scenario, **kwargs)[1]


def _named(tp: int, pp: int, conc: int | None, kwargs: dict) -> dict:
    """build_scenario's keywords from predict's: tp, pp and conc (positional or not),
    with their aliases in `kwargs` (scenario/aliases.py: the command line's names and
    the engines', e.g. tensor_parallel_size=8, rate=2) taking a value left at its default."""
    given = canonical(kwargs)
    for name, value, default in (("tp", tp, 1), ("pp", pp, 1), ("concurrency", conc, None)):
        if name in given and value != default and given[name] != value:
            raise UserError(
                f"{name} is given twice ({value!r} and {given[name]!r} by another name); give it once"
            )
        if name not in given:
            given[name] = value
    return given


def predict(
    tp: int = 1,
    pp: int = 1,
    conc: int | None = None,
    *,
    warmup_requests: int | None = None,
    measure_requests: int | None = None,
    max_measure_requests: int | None = None,
    ci_target: float | None = CI_TARGET,
    intervals: bool = True,
    ensemble: bool = False,
    record: str = "summary",
    progress: bool | None = None,
    **kwargs: Any,
) -> Result:
    """Predict one scenario. Keyword arguments are those of `build_scenario` (passed on
    as given: it checks each, whatever its type, as the command line's values are)
    (model, profile, engine, box, layers, rate_rps, num_requests, trace, input_len,
    output_len, seed) and the engine's knobs (e.g. max_running_requests).
    `intervals=True` adds prediction intervals (pipesim.report.uncertainty), their workload
    part from the run itself; `ensemble=True` takes it from a few short runs more.
    `record="full"` keeps an open loop's requests (`Result.requests`; a closed loop's
    are always kept) at memory that grows with them (runner.simulate). `progress`: a bar
    over the simulated requests once a prediction has taken two seconds (None: only on
    a terminal; True: always, a notebook too; False: never)."""
    scenario = build_scenario(**_named(tp, pp, conc, kwargs))
    return run(
        scenario,
        intervals=("ensemble" if ensemble else "run") if intervals else None,
        record=record,
        progress=progress,
        warmup_requests=warmup_requests,
        measure_requests=measure_requests,
        max_measure_requests=max_measure_requests,
        ci_target=ci_target,
    )


def trace(tp: int = 1, pp: int = 1, conc: int | None = None, **kwargs: Any) -> tuple[dict, Result]:
    """Simulate one scenario (the keywords of `predict`, intervals aside; passed on as
    given, build_scenario and simulate check them) keeping every row, and return its
    Chrome / Perfetto trace object (report/trace.py) and Result."""
    from .report.trace import build_trace

    run_kwargs = {k: kwargs.pop(k) for k in RUN_KEYS if k in kwargs}
    scenario = build_scenario(**_named(tp, pp, conc, kwargs))
    rec, result = simulate(scenario, record="full", **run_kwargs)
    return build_trace(rec, result), result


def sensitivity(
    scenario: Scenario,
    step: float = tornado.DEFAULT_STEP,
    *,
    jobs: int = 1,
    cache: bool = False,
    on_run: Callable[[], object] | None = None,
) -> tornado.Sensitivity:
    """The tornado of a built scenario: which parameters and workload assumptions move
    its answer, each `step` (a fraction) either way; about 2 runs per item, each as long
    as a prediction's (report/sensitivity.py), on `jobs` local processes, each stored with
    `cache=True` and not simulated again while its scenario and pipesim are the same
    (base/cache.py). `on_run()` after each run (progress)."""
    from .base.cache import ResultCache

    store = ResultCache() if cache else None
    return tornado.sensitivity(scenario, step, jobs=jobs, cache=store, on_run=on_run)


def whatif(base: dict, **changes: float) -> tuple[Result, Result]:
    """Predict `base` (the keyword arguments of `pipesim.predict`) and the same with
    `changes` (what-if knobs, whatif.KNOBS) on top: (base result, changed result)."""
    check(changes)
    return predict(**base), predict(**{**base, **changes})

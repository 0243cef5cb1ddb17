"""Cross-check against the public validation corpus (validation/, pipesim.calibrate.corpus).

Every corpus run pipesim can express (pipesim.calibrate.corpus_scenario says how a run
becomes a scenario and what is skipped) is simulated by two paths and each of its
measured numbers compared with both predictions: the path a user gets for that box and
engine (the catalogue's profile: measured tables where they exist), and the roofline
path (no table at all). A run that pipesim cannot express is listed with the reason. No
prediction is fitted to the corpus (docs/validation.md); only the likely band of
roofline-priced predictions is (pipesim.calibrate.residuals, fitted on the roofline
path's numbers, with its leave-one-out coverage).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from .corpus_report import (
    CONDITION,
    Check,
    _filled,
    _ranking,
    kendall_tau,
    overall,
    pairwise_agreement,
    per_metric,
    per_source,
    ranking,
    split_name,
    text,
    to_json,
)
from .corpus_scenario import (
    PATHS,
    Skip,
    box_for,
    knobs_for,
    lengths_for,
    model_for,
    parallel_for,
    profile_for,
    scenario_for,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..base.cache import ResultCache
    from ..measure.metrics import Result
    from ..scenario.build import Scenario

# corpus metric -> (Result field or derived name, interval family)
METRIC_MAP = {
    "output_tok_s": ("output_throughput_tok_s", "output_throughput_tok_s"),
    "total_tok_s": ("total_tok_s", "output_throughput_tok_s"),
    "request_s": ("request_throughput_req_s", "output_throughput_tok_s"),
    "per_request_tok_s": ("per_request_tok_s", "per_request_tok_s"),
    "ttft_ms_mean": ("ttft_ms_mean", "ttft_ms_p50"),
    "ttft_ms_p50": ("ttft_ms_p50", "ttft_ms_p50"),
    "ttft_ms_p99": ("ttft_ms_p99", "ttft_ms_p99"),
    "tpot_ms_mean": ("tpot_ms_mean", "tpot_ms_p50"),
    "tpot_ms_p50": ("tpot_ms_p50", "tpot_ms_p50"),
    "tpot_ms_p99": ("tpot_ms_p99", "tpot_ms_p99"),
    "e2el_ms_mean": ("e2e_ms_mean", "tpot_ms_p50"),
}


def _predicted(result: Result, inp: str, out: str) -> dict:
    from ..inputs.workload import Lengths

    vals = {f: getattr(result, f) for f, _ in METRIC_MAP.values() if hasattr(result, f)}
    mi, mo = Lengths.parse(inp, "input").mean, Lengths.parse(out, "output").mean
    vals["total_tok_s"] = result.output_throughput_tok_s * (mi + mo) / mo
    return vals


def summary(corpus: pd.DataFrame) -> dict:
    runs = corpus.drop_duplicates("run_id")
    split = runs.assign(
        split=runs.tp.astype(str)
        + "x"
        + runs.pp.astype(str)
        + "x"
        + runs.dp.astype(str)
        + "x"
        + runs.ep.astype(str)
    )
    cond = [c for c in CONDITION if c != "metric"]
    multi = _filled(split).groupby(cond, dropna=False)["split"].nunique()
    multi_sources = multi[multi > 1].reset_index()["source_id"].nunique()
    return {
        "rows": len(corpus),
        "runs": len(runs),
        "sources": corpus.source_id.nunique(),
        "rows_pp_gt_1": int((corpus.pp > 1).sum()),
        "runs_pp_gt_1": int((runs.pp > 1).sum()),
        "sources_with_several_splits": int(multi_sources),
    }


def _rows(part: pd.DataFrame, sc: Scenario, result: Result, path: str) -> list[dict]:
    """The compared numbers of one run's prediction by one path, with its band."""
    from ..report.uncertainty import intervals

    _iv, basis = intervals(result, sc, workload="none")
    pred = _predicted(result, str(sc.workload.input_len), str(sc.workload.output_len))
    rows = []
    r: Any  # a row: its columns' values (the stubs make each field any scalar)
    for r in part.itertuples():
        if r.metric not in METRIC_MAP:
            continue  # p90s, ITL: pipesim reports p50 / p99 and TPOT
        field, family = METRIC_MAP[r.metric]
        p = pred.get(field, float("nan"))
        part_ = basis["parts"][family]
        c, below, above = part_["centre_log"], part_["below_log"], part_["above_log"]
        lo, hi = (
            (p * math.exp(c - below), p * math.exp(c + above)) if math.isfinite(p) else (float("nan"),) * 2
        )
        rows.append(
            {
                "row_id": r.row_id,
                "run_id": r.run_id,
                "source_id": r.source_id,
                "metric": r.metric,
                "path": path,
                "tp": r.tp,
                "pp": r.pp,
                "dp": r.dp,
                "ep": r.ep,
                "nodes": r.nodes,
                "measured": r.value,
                # the simulation's own number: the printed headline is it x e^centre (docs/uncertainty.md)
                "predicted": p,
                "error_pct": (p - r.value) / r.value * 100,
                "lo": lo,
                "hi": hi,
                "inside": bool(lo <= r.value <= hi),
                "profile": sc.profile.name,
                "box": sc.box.name,
                "launch_flags": r.launch_flags,
                # what the band was built from (calibration/fit_residuals.py refits it from these)
                "family": family,
                "unmeasured_share": basis["unmeasured_share"],
                "calibration_rel": part_["calibration"],
                "simulation_rel": part_["simulation"],
                "unchecked_rel": part_.get("unchecked", 0.0),
                "table_band": basis["table_band"],
                "centre_log": c,
                **{c: getattr(r, c) for c in CONDITION if c not in ("source_id", "metric")},
            }
        )
    return rows


def _scenarios(part: pd.DataFrame) -> tuple[Scenario, Scenario | None]:
    """A corpus run's scenarios by the user's path and by the roofline (None: the same
    as the user's, which has no table, or one the roofline cannot express); Skip when
    pipesim cannot express the run."""
    first = part.iloc[0].to_dict()
    totals = dict(zip(part.metric, part.value))
    user = scenario_for(first, totals, "user")
    if not len(user.profile.tables):
        return user, None
    try:
        return user, scenario_for(first, totals, "roofline")
    except Skip:  # a run the user's tables can express but the roofline cannot (none known)
        return user, None


def _compare(shared: object, part: pd.DataFrame) -> tuple[list, list]:
    """One corpus run's compared numbers by the user's path and by the roofline path
    (a worker's task, base/pool.py). A user path with no table is the roofline path:
    run once."""
    from ..api import run as simulate

    user, roof = _scenarios(part)
    got = _rows(part, user, simulate(user), "user")
    if not len(user.profile.tables):
        return got, [{**r, "path": "roofline"} for r in got]
    return got, [] if roof is None else _rows(part, roof, simulate(roof), "roofline")


def check(
    corpus: pd.DataFrame,
    progress: Callable[[object], object] | None = None,
    jobs: int = 1,
    cache: ResultCache | None = None,
) -> Check:
    """Simulate every expressible run of `corpus` (pipesim.calibrate.corpus.load_corpus()) by
    both paths and compare each of its measured numbers; intervals are the cheap form
    (calibration and the run's CI, no ensemble: docs/uncertainty.md). Every run is
    first built and looked up in `cache` (base/cache.py: a run whose rows, scenarios and
    pipesim did not change is not simulated again); the runs left are counted in a
    sweep's work bound (base/checks.py) and spread over `jobs` processes (the same
    numbers: every run is deterministic). `progress(run_id)` after each run, skipped,
    found or simulated."""
    from ..base.cache import result_key
    from ..base.checks import check_sweep_work
    from ..base.pool import map_shared
    from ..scenario.build import scenario_steps
    from ..scenario.fingerprint import fingerprint

    items = list(corpus.groupby("run_id", sort=True))
    outcomes: dict = {}
    todo, keys, steps = [], {}, 0.0
    for run_id, part in items:
        try:
            user, roof = _scenarios(part)
        except Skip as exc:
            outcomes[run_id] = {"source_id": part.iloc[0]["source_id"], "rows": len(part), "reason": str(exc)}
            if progress:
                progress(run_id)
            continue
        keys[run_id] = result_key(
            "corpus", fingerprint(user), "-" if roof is None else fingerprint(roof), part.to_csv(index=False)
        )
        found = cache.get(keys[run_id]) if cache is not None else None
        if found is not None:
            outcomes[run_id] = found
            if progress:
                progress(run_id)
            continue
        todo.append((run_id, part))
        steps += scenario_steps(user)[0] + (scenario_steps(roof)[0] if roof is not None else 0.0)
    check_sweep_work(steps, len(todo))
    finished = (lambda i: progress(todo[i][0])) if progress else None
    for (run_id, _), got in zip(todo, map_shared(_compare, None, [p for _, p in todo], jobs, finished)):
        outcomes[run_id] = got
        if cache is not None:
            cache.put(keys[run_id], got)
    rows, roof_rows, skipped = [], [], []
    for run_id, _ in items:
        out = outcomes[run_id]
        if isinstance(out, dict):
            skipped.append({"run_id": run_id, **out})
        else:
            rows += out[0]
            roof_rows += out[1]
    df = pd.DataFrame(rows)
    return Check(
        df,
        pd.DataFrame(skipped, columns=["run_id", "source_id", "rows", "reason"]),
        _ranking(df),
        summary(corpus),
        pd.DataFrame(roof_rows),
    )


__all__ = [
    "PATHS",
    "Check",
    "Skip",
    "box_for",
    "check",
    "kendall_tau",
    "knobs_for",
    "lengths_for",
    "model_for",
    "overall",
    "pairwise_agreement",
    "parallel_for",
    "per_metric",
    "per_source",
    "profile_for",
    "ranking",
    "scenario_for",
    "split_name",
    "summary",
    "text",
    "to_json",
]

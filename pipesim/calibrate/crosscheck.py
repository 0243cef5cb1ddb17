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
    from collections.abc import Callable, Iterable

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


def _compare(item: tuple) -> tuple[list, list, dict | None]:
    """One corpus run: (its numbers by the user's path, by the roofline path, None), or
    ([], [], the skipped run). A user path with no table is the roofline path: run once."""
    from ..api import run as simulate

    run_id, part = item
    first = part.iloc[0].to_dict()
    totals = dict(zip(part.metric, part.value))
    try:
        user = scenario_for(first, totals, "user")
    except Skip as exc:
        return (
            [],
            [],
            {"run_id": run_id, "source_id": first["source_id"], "rows": len(part), "reason": str(exc)},
        )
    got = _rows(part, user, simulate(user), "user")
    if not len(user.profile.tables):
        return got, [{**r, "path": "roofline"} for r in got], None
    try:
        roof = scenario_for(first, totals, "roofline")
    except Skip:  # a run the user's tables can express but the roofline cannot (none known)
        return got, [], None
    return got, _rows(part, roof, simulate(roof), "roofline"), None


def check(corpus: pd.DataFrame, progress: Callable[[object], None] | None = None, jobs: int = 1) -> Check:
    """Simulate every expressible run of `corpus` (pipesim.calibrate.corpus.load_corpus()) by
    both paths and compare each of its measured numbers; intervals are the cheap form
    (calibration and the run's CI, no ensemble: docs/uncertainty.md). `jobs` > 1 spreads
    the runs over that many processes (the same numbers: every run is deterministic)."""
    items = list(corpus.groupby("run_id", sort=True))
    rows, roof, skipped = [], [], []
    outcomes: Iterable[tuple[list, list, dict | None]]  # _compare's, in order
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            outcomes = list(pool.map(_compare, items, chunksize=1))
    else:
        outcomes = map(_compare, items)
    for (run_id, _), (got, got_roof, skip) in zip(items, outcomes):
        rows += got
        roof += got_roof
        skipped += [skip] if skip else []
        if progress and not skip:
            progress(run_id)
    df = pd.DataFrame(rows)
    return Check(
        df,
        pd.DataFrame(skipped, columns=["run_id", "source_id", "rows", "reason"]),
        _ranking(df),
        summary(corpus),
        pd.DataFrame(roof),
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

"""Reporting of the corpus check (pipesim.calibrate.crosscheck): error per source and per
metric by each path (the user's, the roofline), the ranking of splits under one
condition, the text and JSON forms."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

# what one split is compared under: runs of a source equal on all of these
CONDITION = (
    "source_id",
    "engine",
    "engine_version",
    "model",
    "quantization",
    "kv_cache_dtype",
    "workload",
    "num_prompts",
    "concurrency",
    "request_rate",
    "metric",
)


@dataclass(frozen=True)
class Check:
    """The outcome of the corpus check."""

    rows: pd.DataFrame  # one per compared number, by the path a user gets (the catalogue's profile)
    skipped: pd.DataFrame  # one per skipped run: run_id, source_id, rows, reason
    ranking: pd.DataFrame  # one per condition with several splits (the user's path)
    corpus: dict  # rows, runs, sources, PP > 1, several splits
    roofline: pd.DataFrame = field(default_factory=pd.DataFrame)  # the same numbers by the roofline path


def _filled(df: pd.DataFrame) -> pd.DataFrame:
    """Unstated loads as -1, so that runs without a concurrency or a rate group together."""
    return df.fillna({"num_prompts": -1, "concurrency": -1, "request_rate": -1})


def pairwise_agreement(
    measured: Sequence[float] | np.ndarray, predicted: Sequence[float] | np.ndarray
) -> tuple[float, int]:
    """(share of pairs ordered alike, pairs): ties in either count half."""
    agree, pairs = 0.0, 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            a, b = np.sign(measured[i] - measured[j]), np.sign(predicted[i] - predicted[j])
            agree += 1.0 if a == b and a != 0 else 0.5 if a == 0 or b == 0 else 0.0
            pairs += 1
    return (agree / pairs if pairs else float("nan")), pairs


def kendall_tau(measured: Sequence[float] | np.ndarray, predicted: Sequence[float] | np.ndarray) -> float:
    """Kendall's tau-b of the two orderings (scipy)."""
    from scipy.stats import kendalltau

    return float(kendalltau(measured, predicted).statistic) if len(measured) > 1 else float("nan")


# the launch flags that set the split; two runs are a split comparison when their flags
# differ in these alone (validation/README.md)
PARALLEL_FLAGS = re.compile(
    r"(?:^|\s)(?:-tp|-pp|-dp|--tp|--pp|--dp|--tp-size|--pp-size|--dp-size|--ep-size|--tensor-parallel-size"
    r"|--pipeline-parallel-size|--data-parallel-size)(?:[ =]\S+)|(?:^|\s)--enable-expert-parallel\b"
)
# metrics whose order ranks splits; request rate and total tok/s order as output tok/s does
RANKED = ("output_tok_s", "per_request_tok_s", "tpot_ms_mean", "ttft_ms_mean")


def other_flags(flags: str) -> str:
    """The launch flags without the parallel ones, whitespace collapsed."""
    return " ".join(PARALLEL_FLAGS.sub(" ", flags or "").split())


def _ranking(df: pd.DataFrame) -> pd.DataFrame:
    """Per condition (CONDITION, and launch flags equal but for the parallel ones) with
    several splits and a ranked metric: how often predicted and measured order the
    splits alike."""
    cols = ["source_id", "metric", "condition", "splits", "pairs", "agreement", "kendall_tau"]
    out: list[dict] = []
    if df.empty or "launch_flags" not in df:
        return pd.DataFrame(out, columns=cols)
    d = _filled(df[df.metric.isin(RANKED)]).assign(other_flags=lambda x: x.launch_flags.map(other_flags))
    for key, g in d.groupby([*CONDITION, "other_flags"], dropna=False):
        g = g.assign(split=[split_name(r) for r in g.itertuples()])
        if g.split.nunique() < len(g) or len(g) < 2:
            continue  # one split run twice differs in more than the split
        share, pairs = pairwise_agreement(g.measured.to_numpy(), g.predicted.to_numpy())
        out.append(
            {
                "source_id": key[0],
                "metric": key[-2],
                "condition": f"{key[3]}, {key[6][:40]}, C={key[8]}",
                "splits": ",".join(g.split),
                "pairs": pairs,
                "agreement": share,
                "kendall_tau": kendall_tau(g.measured.to_numpy(), g.predicted.to_numpy()),
            }
        )
    return pd.DataFrame(out, columns=cols)


class Split(Protocol):
    """A corpus run, or a row of its table: the split it states (dp and ep where it
    states them); only printed."""

    @property
    def tp(self) -> object: ...
    @property
    def pp(self) -> object: ...


def split_name(r: Split) -> str:
    """TP4xPP1, TP4xPP1xEP4, TP8xPP1xDP8: a run's split as the corpus states it."""
    dp, ep = getattr(r, "dp", 1), getattr(r, "ep", 1)
    return f"TP{r.tp}xPP{r.pp}" + (f"xDP{dp}" if dp > 1 else "") + (f"xEP{ep}" if ep > 1 else "")


def per_source(df: pd.DataFrame) -> pd.DataFrame:
    """Per source: numbers compared, mean and median |error| in %, coverage."""
    if df.empty:
        return pd.DataFrame(
            columns=["source_id", "numbers", "runs", "mape_pct", "median_ape_pct", "coverage"]
        )
    g = df.assign(ape=df.error_pct.abs()).groupby("source_id")
    return pd.DataFrame(
        {
            "numbers": g.size(),
            "runs": g.run_id.nunique(),
            "mape_pct": g.ape.mean(),
            "median_ape_pct": g.ape.median(),
            "coverage": g.inside.mean(),
        }
    ).reset_index()


def ranking(df: pd.DataFrame) -> pd.DataFrame:
    """The ranking of splits of one path's rows (`_ranking`)."""
    return _ranking(df)


def per_metric(df: pd.DataFrame) -> pd.DataFrame:
    """Per metric: numbers, median and mean |error| in %, coverage, mean signed error."""
    cols = ["metric", "numbers", "median_ape_pct", "mape_pct", "coverage", "mean_error_pct"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.assign(ape=df.error_pct.abs()).groupby("metric")
    return pd.DataFrame(
        {
            "numbers": g.size(),
            "median_ape_pct": g.ape.median(),
            "mape_pct": g.ape.mean(),
            "coverage": g.inside.mean(),
            "mean_error_pct": g.error_pct.mean(),
        }
    ).reset_index()[cols]


def overall(df: pd.DataFrame) -> dict:
    """Numbers, runs, mean and median |error| in %, coverage of one path's rows."""
    if df.empty:
        return {"numbers": 0, "runs": 0, "mape_pct": None, "median_ape_pct": None, "coverage": None}
    ape = df.error_pct.abs()
    return {
        "numbers": len(df),
        "runs": int(df.run_id.nunique()),
        "mape_pct": float(ape.mean()),
        "median_ape_pct": float(ape.median()),
        "coverage": float(df.inside.mean()),
    }


PATH_TEXT = {
    "user": "user path (the catalogue's profile for each box and engine: measured tables where they exist)",
    "roofline": "roofline path (no table: every cost by the roofline)",
}


def text(chk: Check) -> str:
    c = chk.corpus
    lines = [
        (
            f"corpus: {c['rows']} rows, {c['runs']} runs, {c['sources']} sources; PP > 1: {c['rows_pp_gt_1']} rows "
            f"({c['runs_pp_gt_1']} runs); sources with several splits under one condition: "
            f"{c['sources_with_several_splits']}"
        ),
        (
            f"reproduced: {chk.rows.run_id.nunique() if len(chk.rows) else 0} runs, {len(chk.rows)} numbers; "
            f"skipped: {len(chk.skipped)} runs ({int(chk.skipped.rows.sum()) if len(chk.skipped) else 0} rows)"
        ),
        "",
    ]
    ps = per_source(chk.rows)
    r: Any  # a row: its columns' values (the stubs make each field any scalar)
    lines.append(f"  {'source':52s} {'numbers':>7s} {'runs':>5s} {'MAPE':>8s} {'median':>8s} {'in band':>8s}")
    for r in ps.itertuples():
        lines.append(
            f"  {r.source_id:52s} {r.numbers:7d} {r.runs:5d} {r.mape_pct:7.1f}% {r.median_ape_pct:7.1f}% "
            f"{r.coverage:7.0%}"
        )
    for path, df in (("user", chk.rows), ("roofline", chk.roofline)):
        if df.empty:
            continue
        o = overall(df)
        lines.append(
            f"  {'overall, ' + path + ' path':52s} {o['numbers']:7d} {o['runs']:5d} {o['mape_pct']:7.1f}% "
            f"{o['median_ape_pct']:7.1f}% {o['coverage']:7.0%}"
        )
        for r in per_metric(df).itertuples():
            lines.append(
                f"    {r.metric:50s} {r.numbers:7d} {'':5s} {r.mape_pct:7.1f}% {r.median_ape_pct:7.1f}% "
                f"{r.coverage:7.0%}"
            )
    if len(chk.rows):
        profiles = chk.rows.drop_duplicates("run_id").profile.value_counts()
        lines.append(
            "  " + PATH_TEXT["user"] + ": " + ", ".join(f"{p} {n}" for p, n in profiles.items()) + " runs"
        )
    if len(chk.ranking):
        rk = chk.ranking
        lines += [
            "",
            (
                f"ranking of splits under one condition: {len(rk)} groups, {int(rk.pairs.sum())} pairs, "
                f"pairwise agreement {np.average(rk.agreement, weights=rk.pairs):.0%}, "
                f"mean Kendall tau {rk.kendall_tau.mean():+.2f}"
            ),
        ]
    else:
        lines += ["", "ranking of splits: no reproduced condition has several splits"]
    if len(chk.skipped):
        lines += ["", "skipped (reason: runs):"]
        for reason, g in chk.skipped.groupby("reason"):
            lines.append(f"  {reason}: {len(g)}")
    return "\n".join(lines)


def to_json(chk: Check) -> str:
    import json

    from ..base.files import json_text

    def records(df: pd.DataFrame) -> list[dict]:
        return json.loads(df.to_json(orient="records"))

    rk = chk.ranking
    over = {
        **overall(chk.rows),
        "ranking_pairs": int(rk.pairs.sum()) if len(rk) else 0,
        "ranking_agreement": float(np.average(rk.agreement, weights=rk.pairs)) if len(rk) else None,
    }
    return json_text(
        {
            "corpus": chk.corpus,
            "overall": over,
            "overall_roofline": overall(chk.roofline),
            "per_metric": records(per_metric(chk.rows)),
            "per_metric_roofline": records(per_metric(chk.roofline)),
            "per_source": records(per_source(chk.rows)),
            "ranking": records(rk),
            "rows": records(chk.rows),
            "roofline_rows": records(chk.roofline),
            "skipped": records(chk.skipped),
        },
        indent=2,
    )

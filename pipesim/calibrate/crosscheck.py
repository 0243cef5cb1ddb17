"""Cross-check against the public validation corpus (validation/, pipesim.corpus).

Every corpus run pipesim can express is simulated once, from the matching box preset
and profile, and each of its measured numbers is compared with the prediction; a run
that pipesim cannot express is listed with the reason. Nothing here is fitted: the
corpus is for checking only (docs/validation.md).

How a run becomes a scenario (each rule stated, none tuned):
- box: the preset of the row's GPU (A100 80 GB, H100 SXM or PCIe, H200, B200, L40S,
  L4, RTX PRO 6000); one node only;
- model: a preset of the same architecture (Llama 3.3 70B is Llama 3.1 70B's; DeepSeek
  R1 is DeepSeek V3's), its weight format as the row's checkpoint;
- profile: a shipped profile measured on the same GPU (and, if it names one, for the
  same model), preferring the row's engine; else the engine's scheduling with no
  tables and neutral parameters: every operation priced by the roofline;
- workload: random lengths as the row gives them (sglang.bench_serving with
  random_range_ratio 0 draws uniform [1, L]); ShareGPT rows are skipped (the row does
  not give the length distribution);
- load: max concurrency C -> closed loop of C; no concurrency and rate inf -> all
  num_prompts requests at t = 0 (a trace); a finite rate -> Poisson at that rate;
- engine flags: --max-num-seqs, --max-num-batched-tokens, --enforce-eager (vLLM);
  --max-running-requests, --chunked-prefill-size, --disable-cuda-graph (SGLang).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Callable

    from numpy.typing import ArrayLike

    from ..profile import Profile
    from ..scenario import Scenario

# hardware text (lower case) -> box preset; first match wins
BOXES = (
    ("a100 40gb", None),
    ("a100", "a100-sxm-8x"),
    ("h100 pcie", "h100-pcie-8x"),
    ("h100", "h100-sxm-8x"),
    ("h200", "h200-sxm-8x"),
    ("b200", "b200-8x"),
    ("l40s", "l40s-8x"),
    ("l4", "l4-8x"),
    ("rtx pro 6000", "rtx-pro-6000-server-8x"),
)
# model id (lower case) fragment -> (preset, checkpoint weight format it stands for)
MODELS = (
    ("deepseek-v3.2", None, "DeepSeek sparse attention (V3.2) is not modelled"),
    ("llama-3.3-70b", "llama-3.1-70b", "bf16"),
    ("llama-3.1-70b", "llama-3.1-70b", "bf16"),
    ("llama-3.1-8b", "llama-3.1-8b", "bf16"),
    ("deepseek-r1", "deepseek-v3", "fp8"),
    ("deepseek-v3", "deepseek-v3", "fp8"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b", "bf16"),
)
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
FLAGS = {
    "vllm": (("--max-num-seqs", "max_num_seqs"), ("--max-num-batched-tokens", "max_num_batched_tokens")),
    "sglang": (
        ("--max-running-requests", "max_running_requests"),
        ("--chunked-prefill-size", "chunked_prefill_size"),
    ),
}
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


class Skip(Exception):
    """A run pipesim cannot express; the message is the reason."""


@dataclass(frozen=True)
class Check:
    """The outcome of the corpus check."""

    rows: pd.DataFrame  # one per compared number
    skipped: pd.DataFrame  # one per skipped run: run_id, source_id, rows, reason
    ranking: pd.DataFrame  # one per condition with several splits
    corpus: dict  # rows, runs, sources, PP > 1, several splits


def box_for(hardware: str) -> str:
    h = hardware.lower()
    for key, box in BOXES:
        if key in h:
            if box is None:
                raise Skip(f"no box preset for {hardware}")
            return box
    raise Skip(f"no box preset for {hardware}")


def model_for(model: str, quantization: str) -> str:
    m = model.lower()
    for key, preset, fmt in MODELS:
        if key in m:
            if preset is None:
                raise Skip(fmt)
            q = (quantization or "").split(" ")[0]
            if q != fmt:
                raise Skip(f"{model} with {quantization or 'unstated'} weights: the {preset} preset is {fmt}")
            return preset
    raise Skip(f"no model preset for {model} (pipesim needs its config.json)")


def lengths_for(workload: str) -> tuple[str, str]:
    """(input, output) as pipesim length texts, from the row's workload description."""
    w = workload
    m = re.search(r"input (\d+) tokens, output (\d+) tokens", w) or re.search(
        r"input (\d+) / output (\d+) tokens", w
    )
    if m and ("range-ratio" not in w or "--random-range-ratio 1" in w):
        return m.group(1), m.group(2)
    m = re.search(r"--random-input (\d+) --random-output (\d+), random_range_ratio 0\.0", w)
    if m and "sglang.bench_serving" in w:
        return f"1:{m.group(1)}", f"1:{m.group(2)}"
    if w.lower().startswith("sharegpt"):
        raise Skip("ShareGPT: the row does not give the length distribution")
    raise Skip(f"workload not understood: {w[:60]}")


def knobs_for(engine: str, flags: str) -> dict:
    out = {}
    for flag, knob in FLAGS[engine]:
        m = re.search(re.escape(flag) + r"[ =](\d+)", flags or "")
        if m:
            out[knob] = int(m.group(1))
    if engine == "vllm" and "--enforce-eager" in (flags or ""):
        out["enforce_eager"] = True
    if engine == "sglang" and "--disable-cuda-graph" in (flags or ""):
        out["disable_cuda_graph"] = True
    for unsupported in (
        "--speculative",
        "--enable-dp-attention",
        "--enable-expert-parallel",
        "--data-parallel-size",
    ):
        if unsupported in (flags or ""):
            raise Skip(f"launch flag {unsupported} is not modelled")
    return out


def profile_for(box: str, engine: str, model: str) -> Profile:
    """A shipped profile measured on the box's GPU (for this model, if it names one),
    the row's engine first; else the engine's scheduling with the roofline alone."""
    from ..errors import UserError
    from ..hardware import load_box
    from ..profile import Params, Tables, load_profile, profile_names

    gpu = load_box(box).gpu.name
    fits = []
    for name in profile_names():
        p = load_profile(name)
        try:
            same_gpu = load_box(p.box).gpu.name == gpu
        except UserError:  # a profile's own box file, not a preset
            same_gpu = False
        if same_gpu and p.meta.get("model", model) == model:
            fits.append(p)
    fits.sort(key=lambda p: p.engine != engine)
    if fits:
        return fits[0]
    base = load_profile("rtx-pro-6000-vllm" if engine == "vllm" else "rtx-pro-6000-sglang-healthy")
    return replace(
        base, name=f"roofline-{engine}", box=box, params=Params(), meta={}, tables=Tables(), measured=()
    )


def scenario_for(run: dict) -> Scenario:
    """The scenario of a corpus run (raises Skip with the reason)."""
    from ..errors import UserError
    from ..scenario import build_scenario
    from ..workload import Lengths, Workload

    if run["nodes"] != 1:
        raise Skip(f"{run['nodes']} nodes: multi-node runs are not attempted")
    if run["dp"] != 1 or run["ep"] != 1:
        raise Skip(f"DP {run['dp']} / EP {run['ep']}: data and expert parallelism are not modelled here")
    if (run["kv_cache_dtype"] or "").strip() not in ("", "auto"):
        raise Skip(f"--kv-cache-dtype {run['kv_cache_dtype']}: not modelled here")
    box = box_for(run["hardware"])
    model = model_for(run["model"], run["quantization"])
    inp, out = lengths_for(run["workload"])
    knobs = knobs_for(run["engine"], run["launch_flags"])
    prof = profile_for(box, run["engine"], model)
    conc, rate, n = run["concurrency"], run["request_rate"], run["num_prompts"]
    conc = None if conc is None or pd.isna(conc) else int(conc)
    n = None if n is None or pd.isna(n) else int(n)
    try:
        if conc is not None:
            sc = build_scenario(
                tp=run["tp"],
                pp=run["pp"],
                concurrency=conc,
                model=model,
                profile=prof,
                engine=run["engine"],
                box=box,
                input_len=inp,
                output_len=out,
                **knobs,
            )
        elif rate is not None and math.isfinite(rate):
            sc = build_scenario(
                tp=run["tp"],
                pp=run["pp"],
                rate_rps=float(rate),
                num_requests=n or 200,
                model=model,
                profile=prof,
                engine=run["engine"],
                box=box,
                input_len=inp,
                output_len=out,
                **knobs,
            )
        elif n:
            sc = build_scenario(
                tp=run["tp"],
                pp=run["pp"],
                concurrency=1,
                model=model,
                profile=prof,
                engine=run["engine"],
                box=box,
                input_len=inp,
                output_len=out,
                **knobs,
            )
            rng = np.random.default_rng(0)
            li, lo = Lengths.parse(inp, "input"), Lengths.parse(out, "output")
            rows = tuple((0.0, int(i), int(o)) for i, o in zip(li.sample(rng, n), lo.sample(rng, n)))
            sc = replace(
                sc,
                workload=Workload(
                    "trace", li, lo, trace=rows, trace_path=f"{n} requests at t=0", num_requests=n
                ),
            )
        else:
            raise Skip("neither a concurrency, a rate nor a prompt count")
    except UserError as exc:
        raise Skip(f"pipesim rejects it: {exc}") from None
    return sc


def _predicted(result, inp: str, out: str) -> dict:
    from ..workload import Lengths

    vals = {f: getattr(result, f) for f, _ in METRIC_MAP.values() if hasattr(result, f)}
    mi, mo = Lengths.parse(inp, "input").mean, Lengths.parse(out, "output").mean
    vals["total_tok_s"] = result.output_throughput_tok_s * (mi + mo) / mo
    return vals


def pairwise_agreement(measured: ArrayLike, predicted: ArrayLike) -> tuple[float, int]:
    """(share of pairs ordered alike, pairs): ties in either count half."""
    agree, pairs = 0.0, 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            a, b = np.sign(measured[i] - measured[j]), np.sign(predicted[i] - predicted[j])
            agree += 1.0 if a == b and a != 0 else 0.5 if a == 0 or b == 0 else 0.0
            pairs += 1
    return (agree / pairs if pairs else float("nan")), pairs


def kendall_tau(measured: ArrayLike, predicted: ArrayLike) -> float:
    """Kendall's tau-b of the two orderings (scipy)."""
    from scipy.stats import kendalltau

    return float(kendalltau(measured, predicted).statistic) if len(measured) > 1 else float("nan")


def _filled(df: pd.DataFrame) -> pd.DataFrame:
    """Unstated loads as -1, so that runs without a concurrency or a rate group together."""
    return df.fillna({"num_prompts": -1, "concurrency": -1, "request_rate": -1})


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


def check(corpus: pd.DataFrame, progress: Callable[[object], None] | None = None) -> Check:
    """Simulate every expressible run of `corpus` (pipesim.corpus.load_corpus()) once
    and compare each of its measured numbers; intervals are the cheap form (calibration
    and the run's CI, no ensemble: docs/uncertainty.md)."""
    from ..api import run as simulate
    from ..uncertainty import intervals

    rows, skipped = [], []
    for run_id, part in corpus.groupby("run_id", sort=True):
        first = part.iloc[0].to_dict()
        try:
            sc = scenario_for(first)
        except Skip as exc:
            skipped.append(
                {"run_id": run_id, "source_id": first["source_id"], "rows": len(part), "reason": str(exc)}
            )
            continue
        result = simulate(sc)
        _iv, basis = intervals(result, sc, workload="none")
        pred = _predicted(result, str(sc.workload.input_len), str(sc.workload.output_len))
        if progress:
            progress(run_id)
        for r in part.itertuples():
            if r.metric not in METRIC_MAP:
                continue  # p90s, ITL: pipesim reports p50 / p99 and TPOT
            field, family = METRIC_MAP[r.metric]
            p = pred.get(field, float("nan"))
            rel = basis["parts"][family]["combined"]
            lo, hi = (p / (1 + rel), p * (1 + rel)) if math.isfinite(p) else (float("nan"),) * 2
            rows.append(
                {
                    "row_id": r.row_id,
                    "run_id": run_id,
                    "source_id": r.source_id,
                    "metric": r.metric,
                    "tp": r.tp,
                    "pp": r.pp,
                    "dp": r.dp,
                    "ep": r.ep,
                    "measured": r.value,
                    "predicted": p,
                    "error_pct": (p - r.value) / r.value * 100,
                    "lo": lo,
                    "hi": hi,
                    "inside": bool(lo <= r.value <= hi),
                    "profile": sc.profile.name,
                    "box": sc.box.name,
                    **{c: getattr(r, c) for c in CONDITION if c not in ("source_id", "metric")},
                }
            )
    df = pd.DataFrame(rows)
    return Check(
        df,
        pd.DataFrame(skipped, columns=["run_id", "source_id", "rows", "reason"]),
        _ranking(df),
        summary(corpus),
    )


def _ranking(df: pd.DataFrame) -> pd.DataFrame:
    out = []
    if df.empty:
        return pd.DataFrame(
            out, columns=["source_id", "metric", "condition", "splits", "pairs", "agreement", "kendall_tau"]
        )
    keys = [c for c in CONDITION]
    for key, g in _filled(df).groupby(keys, dropna=False):
        g = g.assign(split=g.tp.astype(str) + "x" + g.pp.astype(str))
        if g.split.nunique() < 2 or g.metric.iloc[0] not in (
            "output_tok_s",
            "per_request_tok_s",
            "total_tok_s",
            "request_s",
            "tpot_ms_mean",
            "ttft_ms_mean",
        ):
            continue
        share, pairs = pairwise_agreement(g.measured.to_numpy(), g.predicted.to_numpy())
        out.append(
            {
                "source_id": key[0],
                "metric": key[-1],
                "condition": f"{key[3]}, {key[6][:40]}, C={key[8]}",
                "splits": ",".join(f"TP{a}xPP{b}" for a, b in zip(g.tp, g.pp)),
                "pairs": pairs,
                "agreement": share,
                "kendall_tau": kendall_tau(g.measured.to_numpy(), g.predicted.to_numpy()),
            }
        )
    return pd.DataFrame(
        out, columns=["source_id", "metric", "condition", "splits", "pairs", "agreement", "kendall_tau"]
    )


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
    lines.append(f"  {'source':52s} {'numbers':>7s} {'runs':>5s} {'MAPE':>8s} {'median':>8s} {'in band':>8s}")
    for r in ps.itertuples():
        lines.append(
            f"  {r.source_id:52s} {r.numbers:7d} {r.runs:5d} {r.mape_pct:7.1f}% {r.median_ape_pct:7.1f}% "
            f"{r.coverage:7.0%}"
        )
    if len(chk.rows):
        ape = chk.rows.error_pct.abs()
        lines.append(
            f"  {'overall':52s} {len(chk.rows):7d} {chk.rows.run_id.nunique():5d} {ape.mean():7.1f}% "
            f"{ape.median():7.1f}% {chk.rows.inside.mean():7.0%}"
        )
        for metric, g in chk.rows.groupby("metric"):
            lines.append(
                f"    {metric:50s} {len(g):7d} {'':5s} {g.error_pct.abs().mean():7.1f}% "
                f"{g.error_pct.abs().median():7.1f}% {g.inside.mean():7.0%}"
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

    def records(df):
        return json.loads(df.to_json(orient="records"))

    ape = chk.rows.error_pct.abs() if len(chk.rows) else pd.Series(dtype=float)
    rk = chk.ranking
    overall = {
        "numbers": len(chk.rows),
        "runs": int(chk.rows.run_id.nunique()) if len(chk.rows) else 0,
        "mape_pct": float(ape.mean()) if len(ape) else None,
        "median_ape_pct": float(ape.median()) if len(ape) else None,
        "coverage": float(chk.rows.inside.mean()) if len(chk.rows) else None,
        "ranking_pairs": int(rk.pairs.sum()) if len(rk) else 0,
        "ranking_agreement": float(np.average(rk.agreement, weights=rk.pairs)) if len(rk) else None,
    }
    return json.dumps(
        {
            "corpus": chk.corpus,
            "overall": overall,
            "per_source": records(per_source(chk.rows)),
            "ranking": records(rk),
            "rows": records(chk.rows),
            "skipped": records(chk.skipped),
        },
        indent=2,
    )

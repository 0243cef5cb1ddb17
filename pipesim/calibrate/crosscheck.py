"""Cross-check against the public validation corpus (validation/, pipesim.calibrate.corpus).

Every corpus run pipesim can express is simulated once, from the matching box preset
and profile, and each of its measured numbers is compared with the prediction; a run
that pipesim cannot express is listed with the reason. No prediction is fitted to the
corpus (docs/validation.md); only the likely band of roofline-priced predictions is
(pipesim.calibrate.residuals, with its leave-one-out coverage).

How a run becomes a scenario (each rule stated, none tuned):
- box: the preset of the row's GPU (A100 80 GB, H100 SXM or PCIe, H200, B200, L40S,
  L4, RTX PRO 6000); one node only;
- model: a preset of the same architecture (Llama 3.3 70B is Llama 3.1 70B's; DeepSeek
  R1 is DeepSeek V3's), its weight format as the row's checkpoint;
- profile: a shipped profile measured on the same GPU (and, if it names one, for the
  same model), preferring the row's engine; else the engine's scheduling with no
  tables and neutral parameters: every operation priced by the roofline;
- workload: random lengths as the row gives them (sglang.bench_serving with
  random_range_ratio 0 draws uniform [1, L]; "~20k tokens (+-15% variance)" is uniform
  within 15%); ShareGPT (no distribution in the row) as the run's own mean input and
  output tokens per request, (total - output tok/s) / req/s and output tok/s / req/s,
  a fixed length each: a workload input taken from the measurement, so a ShareGPT run's
  request rate and total tok/s carry the same error as its output tok/s, and the spread
  of real lengths (which lengthens the tail of an all-at-once run) is left out;
- KV cache: --kv-cache-dtype as launched (fp8 / fp8_e4m3 / fp8_e5m2; empty or auto: the
  model's 16 bits); a cache with one dtype per layer kind is skipped;
- load: max concurrency C -> closed loop of C; no concurrency and rate inf -> all
  num_prompts requests at t = 0 (a trace); a finite rate -> Poisson at that rate;
- engine flags: --max-num-seqs, --max-num-batched-tokens, --enforce-eager,
  --no-enable-prefix-caching (vLLM);
  --max-running-requests, --chunked-prefill-size, --disable-cuda-graph (SGLang).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .corpus_report import (
    CONDITION,
    Check,
    _filled,
    _ranking,
    kendall_tau,
    pairwise_agreement,
    per_source,
    text,
    to_json,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..profiles.profile import Profile
    from ..scenario.build import Scenario

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
    ("-awq", None, "AWQ checkpoints: no preset (the corpus row does not give its quantization_config)"),
    ("llama-3.3-70b", "llama-3.1-70b", "bf16"),
    ("llama-3.1-70b", "llama-3.1-70b", "bf16"),
    ("llama-3.1-8b", "llama-3.1-8b", "bf16"),
    ("llama-3.1-405b", "llama-3.1-405b", "bf16"),
    ("deepseek-r1", "deepseek-v3", "fp8"),
    ("deepseek-v3", "deepseek-v3", "fp8"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b", "bf16"),
    ("qwen3-14b-fp8", "qwen3-14b-fp8", "fp8"),
    ("qwen3-14b", "qwen3-14b", "bf16"),
    ("qwen3-32b-fp8", "qwen3-32b-fp8", "fp8"),
    ("qwen3-32b", "qwen3-32b", "bf16"),
    # the 2507 Instruct checkpoints have Qwen3-235B-A22B's layers (a longer context)
    ("qwen3-235b-a22b-instruct-2507-fp8", "qwen3-235b-a22b-fp8", "fp8"),
    ("qwen3-235b-a22b", "qwen3-235b-a22b", "bf16"),
    ("gpt-oss-120b", "gpt-oss-120b", "mxfp4"),
    ("gpt-oss-20b", "gpt-oss-20b", "mxfp4"),
    ("glm-4.5-air-fp8", None, "GLM-4.5-Air-FP8: no preset (its quantization_config is not in the row)"),
    ("glm-4.5-air", "glm-4.5-air", "bf16"),
    ("glm-4.6-fp8", "glm-4.6-fp8", "fp8"),
    ("glm-4.6", "glm-4.6", "bf16"),
)
# the corpus's --kv-cache-dtype text -> pipesim's (quantization.kv_cache_dtype reads the rest)
KV_DTYPES = {"": None, "auto": None, "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
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


class Skip(Exception):
    """A run pipesim cannot express; the message is the reason."""


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


def lengths_for(workload: str, totals: dict | None = None) -> tuple[str, str]:
    """(input, output) as pipesim length texts, from the row's workload description;
    for ShareGPT, the run's own mean tokens per request from `totals` (its metric ->
    value: output and total tok/s over requests/s), a fixed length each."""
    w = workload
    m = re.search(r"input (\d+) tokens, output (\d+) tokens", w) or re.search(
        r"input (\d+) / output (\d+) tokens", w
    )
    if m and ("range-ratio" not in w or "--random-range-ratio 1" in w):
        return m.group(1), m.group(2)
    m = re.search(r"~(\d+)k input tokens and ~(\d+)k output tokens \(\+-(\d+)% variance\)", w)
    if m:  # uniform within the stated variance
        spread = int(m.group(3)) / 100
        return tuple(
            f"{round(int(g) * 1000 * (1 - spread))}:{round(int(g) * 1000 * (1 + spread))}"
            for g in m.group(1, 2)
        )
    m = re.search(r"--random-input (\d+) --random-output (\d+), random_range_ratio 0\.0", w)
    if m and "sglang.bench_serving" in w:
        return f"1:{m.group(1)}", f"1:{m.group(2)}"
    if w.lower().startswith("sharegpt"):
        t = totals or {}
        out_s, total_s, req_s = (t.get(k, float("nan")) for k in ("output_tok_s", "total_tok_s", "request_s"))
        if not all(math.isfinite(v) and v > 0 for v in (out_s, total_s, req_s)) or total_s <= out_s:
            raise Skip("ShareGPT: the run prints no token totals to take its mean lengths from")
        return str(round((total_s - out_s) / req_s)), str(max(1, round(out_s / req_s)))
    raise Skip(f"workload not understood: {w[:60]}")


def knobs_for(engine: str, flags: str) -> dict:
    out = {}
    for flag, knob in FLAGS[engine]:
        m = re.search(re.escape(flag) + r"[ =](\d+)", flags or "")
        if m:
            out[knob] = int(m.group(1))
    if engine == "vllm" and "--enforce-eager" in (flags or ""):
        out["enforce_eager"] = True
    if engine == "vllm" and "--no-enable-prefix-caching" in (flags or ""):
        out["enable_prefix_caching"] = False
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
    from ..base.errors import UserError
    from ..inputs.box import load_box
    from ..profiles.profile import Params, load_profile, profile_names
    from ..profiles.tables import Tables

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


def scenario_for(run: dict, totals: dict | None = None) -> Scenario:
    """The scenario of a corpus run (raises Skip with the reason); `totals` are the
    run's measured metric -> value, read only for a ShareGPT run's mean lengths."""
    from ..base.errors import UserError
    from ..inputs.workload import Lengths, Workload
    from ..scenario.build import build_scenario

    if run["nodes"] != 1:
        raise Skip(f"{run['nodes']} nodes: multi-node runs are not attempted")
    if run["dp"] != 1 or run["ep"] != 1:
        raise Skip(f"DP {run['dp']} / EP {run['ep']}: data and expert parallelism are not modelled here")
    kv = (run["kv_cache_dtype"] or "").strip()
    if kv not in KV_DTYPES:
        raise Skip(f"--kv-cache-dtype {kv}: a KV dtype per layer kind is not modelled")
    box = box_for(run["hardware"])
    model = model_for(run["model"], run["quantization"])
    inp, out = lengths_for(run["workload"], totals)
    knobs = knobs_for(run["engine"], run["launch_flags"])
    prof = profile_for(box, run["engine"], model)
    version = run.get("engine_version")
    if prof.name.startswith("roofline-") and isinstance(version, str) and version.strip():
        # the engine sizes its KV pool by its release's rules (docs/engines.md §9)
        prof = replace(prof, engine_version=version.strip())
    conc, rate, n = run["concurrency"], run["request_rate"], run["num_prompts"]
    conc = None if conc is None or pd.isna(conc) else int(conc)
    n = None if n is None or pd.isna(n) else int(n)

    def at_load(**load: object) -> Scenario:  # the run's scenario, at the load its benchmark sent
        return build_scenario(
            tp=run["tp"],
            pp=run["pp"],
            **load,
            model=model,
            profile=prof,
            engine=run["engine"],
            box=box,
            input_len=inp,
            output_len=out,
            kv_cache_dtype=KV_DTYPES[kv],
            **knobs,
        )

    try:
        if conc is not None:
            sc = at_load(concurrency=conc)
        elif rate is not None and math.isfinite(rate):
            sc = at_load(rate_rps=float(rate), num_requests=n or 200)
        elif n:
            sc = at_load(concurrency=1)
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


def _compare(item: tuple) -> tuple[list, dict | None]:
    """One corpus run: (compared rows, None) or ([], the skipped run)."""
    from .. import api

    run_id, part = item
    first = part.iloc[0].to_dict()
    try:
        sc = scenario_for(first, dict(zip(part.metric, part.value)))
    except Skip as exc:
        return [], {"run_id": run_id, "source_id": first["source_id"], "rows": len(part), "reason": str(exc)}
    result = api.run(sc, intervals="none")  # the cheap band: calibration and the run's CI
    basis = result.interval_basis
    pred = _predicted(result, str(sc.workload.input_len), str(sc.workload.output_len))
    rows = []
    for r in part.itertuples():
        if r.metric not in METRIC_MAP:
            continue  # p90s, ITL: pipesim reports p50 / p99 and TPOT
        field, family = METRIC_MAP[r.metric]
        p = pred.get(field, float("nan"))
        part_ = basis["parts"][family]
        c, h = part_["centre_log"], part_["half_log"]
        lo, hi = (p * math.exp(c - h), p * math.exp(c + h)) if math.isfinite(p) else (float("nan"),) * 2
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
                "launch_flags": r.launch_flags,
                # what the band was built from (calibration/fit_residuals.py refits it from these)
                "family": family,
                "unmeasured_share": basis["unmeasured_share"],
                "calibration_rel": part_["calibration"],
                "simulation_rel": part_["simulation"],
                **{c: getattr(r, c) for c in CONDITION if c not in ("source_id", "metric")},
            }
        )
    return rows, None


def check(corpus: pd.DataFrame, progress: Callable[[object], None] | None = None, jobs: int = 1) -> Check:
    """Simulate every expressible run of `corpus` (pipesim.calibrate.corpus.load_corpus()) once
    and compare each of its measured numbers; intervals are the cheap form (calibration
    and the run's CI, no ensemble: docs/uncertainty.md). `jobs` > 1 spreads the runs
    over that many processes (the same numbers: every run is deterministic)."""
    items = list(corpus.groupby("run_id", sort=True))
    rows, skipped = [], []
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            outcomes = pool.map(_compare, items, chunksize=1)
            for (run_id, _), (got, skip) in zip(items, outcomes):
                rows += got
                skipped += [skip] if skip else []
                if progress and not skip:
                    progress(run_id)
    else:
        for run_id, part in items:
            got, skip = _compare((run_id, part))
            rows += got
            skipped += [skip] if skip else []
            if progress and not skip:
                progress(run_id)
    df = pd.DataFrame(rows)
    return Check(
        df,
        pd.DataFrame(skipped, columns=["run_id", "source_id", "rows", "reason"]),
        _ranking(df),
        summary(corpus),
    )


__all__ = [
    "Check",
    "Skip",
    "box_for",
    "check",
    "kendall_tau",
    "knobs_for",
    "lengths_for",
    "model_for",
    "pairwise_agreement",
    "per_source",
    "scenario_for",
    "summary",
    "text",
    "to_json",
]

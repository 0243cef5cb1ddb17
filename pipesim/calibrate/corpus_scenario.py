"""How a corpus run (validation/, pipesim.calibrate.corpus) becomes a pipesim scenario, by
the path a user would get and by the roofline alone (pipesim.calibrate.crosscheck runs them).

Each rule stated, none tuned:
- box: the preset of the row's GPU (A100 80 GB, H100 SXM or PCIe, H200, B200, L40S,
  L4, RTX PRO 6000); a run over several nodes is that many copies of it (`--nodes`,
  the preset's own network);
- model: a preset of the same architecture (Llama 3.3 70B is Llama 3.1 70B's; DeepSeek
  R1 is DeepSeek V3's), its weight format as the row's checkpoint;
- profile, two paths: **user**, what `pipesim predict --box B --engine E --model M`
  gives (`profiles.catalogue.profile_for_box`: a shipped profile measured on the box,
  else AIConfigurator's measured tables for its GPU, else first principles); **roofline**,
  the engine's scheduling with no tables and neutral parameters, every cost priced by the
  roofline (kernels by the fitted efficiency curves, collectives by NCCL's calibrated
  model). Where the user path has no table the two are one prediction;
- engine release: the row's, on both paths, as `--engine-version` (it picks the host
  loop's defaults and rules and the KV pool's rule, docs/engines.md §9-§10; the user
  path's tables are that release's where AIConfigurator measured it, else the newest);
  a row without one takes the profile's;
- parallel split: tp, pp, dp, ep and nodes as the row gives them; SGLang's
  `--enable-dp-attention` is DP attention (off at dp 1, as SGLang turns it off),
  vLLM's `--enable-expert-parallel` expert parallel over dp x tp (docs/parallel.md);
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
  --no-enable-prefix-caching, --async-scheduling, --num-scheduler-steps,
  --disable-async-output-proc (vLLM);
  --max-running-requests, --chunked-prefill-size, --disable-cuda-graph,
  --disable-overlap-schedule (SGLang);
  speculative decoding is not modelled: such a run is skipped.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from ..profiles.profile import Profile
    from ..scenario.build import Scenario

PATHS = ("user", "roofline")

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
FLAGS = {
    "vllm": (
        ("--max-num-seqs", "max_num_seqs"),
        ("--max-num-batched-tokens", "max_num_batched_tokens"),
        ("--num-scheduler-steps", "num_scheduler_steps"),
    ),
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
        inp, out = (
            f"{round(int(g) * 1000 * (1 - spread))}:{round(int(g) * 1000 * (1 + spread))}"
            for g in m.group(1, 2)
        )
        return inp, out
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
    """The engine knobs a row's launch flags set (FLAGS and the switches below); a flag
    pipesim does not model skips the run."""
    out = {}
    for flag, knob in FLAGS[engine]:
        m = re.search(re.escape(flag) + r"[ =](\d+)", flags or "")
        if m:
            out[knob] = int(m.group(1))
    if engine == "vllm" and "--enforce-eager" in (flags or ""):
        out["enforce_eager"] = True
    if engine == "vllm" and "--no-enable-prefix-caching" in (flags or ""):
        out["enable_prefix_caching"] = False
    # the host loop's switches (docs/engines.md §10)
    if engine == "vllm" and re.search(r"--async-scheduling\b", flags or ""):
        out["async_scheduling"] = True
    if engine == "vllm" and "--disable-async-output-proc" in (flags or ""):
        out["disable_async_output_proc"] = True
    if engine == "sglang" and "--disable-cuda-graph" in (flags or ""):
        out["disable_cuda_graph"] = True
    if engine == "sglang" and "--disable-overlap-schedule" in (flags or ""):
        out["disable_overlap_schedule"] = True
    if "--speculative" in (flags or ""):
        raise Skip("launch flag --speculative is not modelled")
    return out


def parallel_for(run: dict) -> dict:
    """build_scenario's parallel keywords for a row: its dp, ep and nodes, SGLang's DP
    attention flag, vLLM's expert-parallel flag (docs/parallel.md §1-2)."""
    flags = run.get("launch_flags") or ""
    out = {"dp": int(run["dp"]), "ep": int(run["ep"]), "nodes": int(run["nodes"])}
    if "--enable-dp-attention" in flags:
        out["dp_attention"] = True
    if "--enable-expert-parallel" in flags:
        out["enable_expert_parallel"] = True
    return out


def profile_for(box: str, engine: str, model: str, path: str = "user", version: str | None = None) -> Profile:
    """The profile of one path (module docstring): `user`, the catalogue's for the box and
    engine (its tables of `version` where measured); `roofline`, the engine's scheduling
    with no tables and neutral parameters."""
    from ..base.errors import UserError
    from ..inputs.box import load_box
    from ..profiles.catalogue import profile_for_box
    from ..profiles.profile import Params, load_profile
    from ..profiles.tables import Tables

    if path == "user":
        try:
            return profile_for_box(load_box(box), engine, model, version)
        except UserError as exc:
            raise Skip(f"no profile for {box} with {engine}: {exc}") from None
    base = load_profile("rtx-pro-6000-vllm" if engine == "vllm" else "rtx-pro-6000-sglang-healthy")
    return replace(
        base, name=f"roofline-{engine}", box=box, params=Params(), meta={}, tables=Tables(), measured=()
    )


def scenario_for(run: dict, totals: dict | None = None, path: str = "user") -> Scenario:
    """The scenario of a corpus run by `path` (PATHS; raises Skip with the reason); `totals`
    are the run's measured metric -> value, read only for a ShareGPT run's mean lengths."""
    from ..base.errors import UserError
    from ..inputs.workload import Lengths, Workload
    from ..scenario.build import build_scenario

    kv = (run["kv_cache_dtype"] or "").strip()
    if kv not in KV_DTYPES:
        raise Skip(f"--kv-cache-dtype {kv}: a KV dtype per layer kind is not modelled")
    box = box_for(run["hardware"])
    model = model_for(run["model"], run["quantization"])
    inp, out = lengths_for(run["workload"], totals)
    knobs = knobs_for(run["engine"], run["launch_flags"])
    parallel = parallel_for(run)
    stated = run.get("engine_version")
    version = stated.strip() if isinstance(stated, str) and stated.strip() else None
    prof = profile_for(box, run["engine"], model, path, version)
    if prof.name.startswith("roofline-") and version:
        prof = replace(prof, engine_version=version)
    conc, rate, n = run["concurrency"], run["request_rate"], run["num_prompts"]
    conc = None if conc is None or pd.isna(conc) else int(conc)
    n = None if n is None or pd.isna(n) else int(n)

    def at_load(**load: Any) -> Scenario:  # the run's scenario, at the load its benchmark sent
        return build_scenario(
            tp=run["tp"],
            pp=run["pp"],
            **parallel,
            **load,
            model=model,
            profile=prof,
            engine=run["engine"],
            box=box,
            input_len=inp,
            output_len=out,
            kv_cache_dtype=KV_DTYPES[kv],
            engine_version=version,
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

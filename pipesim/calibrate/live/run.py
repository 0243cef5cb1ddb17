"""Live calibration: measure a model's operation costs on the NVIDIA GPUs of this machine.

`pipesim calibrate live --model M --out DIR` times, for the model's own shapes, every
operation the cost model looks up (GEMMs, GQA / MLA attention, the MoE layer), the
collectives and P2P transfers between the visible GPUs, and the CPU cost of a decode
loop, and writes a profile that `pipesim predict --profile DIR --model M` uses as is.

The work is split so that everything but the timing runs without a GPU (and is tested
so): `plan_specs` says what to measure (pure), the harness turns each `Spec` into a
`Record` (shape, milliseconds), and `tables_from_records` / `profile_meta` turn
records into the profile's tables and metadata (pure). torch, transformers and tqdm
are imported inside functions only: `import pipesim` never needs them.

How an operation is timed (`_Bench.time_ms`): N copies of it, each with its own
inputs and weights, N x its working set larger than the L2 cache (so every copy reads
cold data, as each layer of a forward pass reads its own weights and KV cache), are
captured back to back into one CUDA graph (eager if capture fails), as an engine's
graph runs a layer's kernels; after warm-up, `reps` replays are bracketed by CUDA
events and the median replay time / N is kept. Before each replay the L2 cache is
flushed by a read and a GPU sleep kernel holds the GPU while the CPU queues the work,
so CPU launch gaps stay out of kernel times (the CPU side is measured separately, as
the decode loop's costs). Where an operation has two implementations (decode
attention: torch SDPA and split-KV), both are timed and the faster kept, as an engine
picks its fastest backend.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ...model import Model, load_model
from ...profile import TABLE_COLUMNS, Params, write_profile

NEEDS_TORCH = "live calibration needs torch: pip install 'pipesim[live]'"
MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01")
# Spare seconds kept for writing the profile when the budget decides what to skip.
WRITE_RESERVE_S = 10.0
# Copies of an operation timed back to back: together COLD_FACTOR x the L2 cache, at most MAX_COPIES.
COLD_FACTOR, MAX_COPIES = 3.0, 32
# Extra decoder layers of the deeper of the two HF models (the CPU cost per layer is their slope).
HF_EXTRA_LAYERS = 16


@dataclass(frozen=True)
class Grids:
    """Sizes to measure. Defaults cover what the simulator asks for typical loads
    (decode batches up to 256, contexts to 32k, prompts to 16k tokens) and fit one
    GPU's budget; interpolation (interp.py) fills between points, proportional
    scaling beyond the largest."""

    m: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    decode_context: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    decode_max_tokens: int = 2**20          # batch x context cap (a 4-8 GB KV cache)
    prefill_isl: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    prefill_batch_extra: tuple[int, ...] = (2, 4, 8)   # optional, prompts up to 4096
    moe_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    sampling_batch: tuple[int, ...] = (1, 8, 64, 256)
    tps: tuple[int, ...] = (1, 2, 4, 8)      # tp > 1 shapes (per-GPU slices) are optional extras
    comm_bytes: tuple[int, ...] = tuple(2**i for i in range(10, 29, 2))  # 1 KiB .. 256 MiB
    hf_batches: tuple[int, ...] = (1, 4, 16, 64)
    hf_prompt: int = 128


@dataclass(frozen=True)
class Spec:
    """One measurement: a profile table (or an extra op) and its key, in the order of
    the table's key columns (TABLE_COLUMNS)."""

    table: str
    key: tuple
    required: bool = True


@dataclass(frozen=True)
class Record:
    table: str
    key: tuple
    latency_ms: float
    method: str = ""          # "graph", "eager", "cpu"


# ---- what to measure (pure) -----------------------------------------------------------

def _probe_box():
    """An 8-GPU box, only so that the cost model can be asked which shapes it needs."""
    from ...hardware import box_from_dict

    links = [{"child": f"gpu{i}", "parent": "switch", "bw_gb_s": 100.0, "latency_us": 1.0} for i in range(8)]
    return box_from_dict({"name": "probe", "gpu": {"name": "probe", "count": 8, "memory_bytes": 1e12,
                                                   "mem_bw_bytes_s": 1e12, "flops_bf16": 1e15},
                          "topology": {"links": links}}, "probe")


def gemm_shapes(model: Model, tp: int) -> list[tuple[int, int]]:
    """The (n, k) of every GEMM the cost model asks for on one GPU at tensor
    parallelism `tp` (attention projections, dense MLP, router, shared expert,
    lm_head), read off `CostModel.stage_ops` itself so the two cannot drift apart."""
    from ... import profile as profile_mod
    from ...costs import CostModel, Shape
    from ...plan import Plan

    tables = getattr(profile_mod, "Tables", dict)()
    empty = profile_mod.Profile("probe", "probe", "sglang", "", Params(), {}, tables)
    seen: list[tuple[int, int]] = []

    class Recorder(CostModel):
        def gemm(self, m, n, k, dtype):
            if (n, k) not in seen:
                seen.append((n, k))
            return 1e-6, "table"

    cm = Recorder(_probe_box(), model, Plan(tp, 1, (model.num_layers,)), empty)
    cm.stage_ops(0, Shape(decode=4, decode_ctx=256, prefill=((32, 0),)))
    return seen


def _tp_ok(model: Model, tp: int) -> bool:
    try:
        model.check_tp(tp)
    except UserError:
        return False
    return tp <= model.heads


def plan_specs(model: Model, grids: Grids = Grids()) -> list[Spec]:
    """Every measurement for `model`, required ones first (the shapes one GPU runs at
    tp=1), then optional extras (the per-GPU slices at tp > 1, prefill at batch > 1)
    that the budget may cut. Within a kind, specs sharing weights are adjacent."""
    req: list[Spec] = []
    opt: list[Spec] = []
    tps = [t for t in grids.tps if _tp_ok(model, t)]
    done: set = set()
    for tp in tps:
        out = req if tp == 1 else opt
        for n, k in gemm_shapes(model, tp):
            if (n, k) in done or n < 1 or k < 1:
                continue
            done.add((n, k))
            out.extend(Spec("gemm", ("bf16", m, n, k), tp == 1) for m in grids.m)
    for tp in tps:
        out = req if tp == 1 else opt
        heads = model.heads // tp
        if model.mla:
            dec_key, pre_key, dec, pre = (heads,), (heads,), "mla_decode", "mla_prefill"
        else:
            kv = max(model.kv_heads // tp, 1)
            dec_key = pre_key = (heads, kv, model.head_dim)
            dec, pre = "gqa_decode", "gqa_prefill"
        for b in grids.decode_batch:
            for c in grids.decode_context:
                if b * c <= grids.decode_max_tokens:
                    out.append(Spec(dec, dec_key + (b, c), tp == 1))
        for isl in grids.prefill_isl:
            out.append(Spec(pre, pre_key + (1, isl), tp == 1))
        if tp == 1:
            opt.extend(Spec(pre, pre_key + (b, isl), False)
                       for b in grids.prefill_batch_extra for isl in grids.prefill_isl if isl <= 4096)
    if model.moe:
        mo = model.moe
        for tp in tps:
            if mo.moe_intermediate % tp:
                continue
            out = req if tp == 1 else opt
            for dist in MOE_DISTRIBUTIONS:
                out.extend(Spec("moe", ("bf16", model.hidden, mo.moe_intermediate, mo.topk, mo.n_routed_experts,
                                        tp, dist, t), tp == 1) for t in grids.moe_tokens)
    for mode in ("greedy", "sample"):
        req.extend(Spec("sampling", (mode, b)) for b in grids.sampling_batch)
    return req + opt


def route(tokens: int, experts: int, topk: int, distribution: str, rng: np.random.Generator) -> np.ndarray:
    """Top-k expert ids per token, (tokens, topk), distinct within a row.

    balanced: every token draws k distinct experts uniformly (the cost model's
    distinct-expert formula assumes this). power_law_A: expert popularity falls as
    rank^-A (Zipf-like; ranks a random permutation), k drawn without replacement in
    proportion to popularity (Gumbel top-k), so a few experts take most tokens, as in
    AIConfigurator's power_law rows."""
    if distribution == "balanced":
        logp = np.zeros(experts)
    elif distribution.startswith("power_law_"):
        alpha = float(distribution[len("power_law_"):])
        logp = -alpha * np.log(rng.permutation(experts) + 1.0)
    else:
        raise UserError(f"unknown routing distribution '{distribution}'; known: {', '.join(MOE_DISTRIBUTIONS)}")
    keys = logp[None, :] + rng.gumbel(size=(tokens, experts))
    return np.argpartition(-keys, topk - 1, axis=1)[:, :topk].astype(np.int64)


def _sig6(x: float) -> float:
    return float(f"{x:.6g}")


def tables_from_records(records: list[Record]) -> dict[str, pd.DataFrame]:
    """Profile tables from records: TABLE_COLUMNS schemas, the median of repeated keys,
    6 significant digits, rows sorted by key. Records of other ops are left out (see
    `extras_frame`); non-positive latencies (a timer artefact) are dropped."""
    rows: dict[str, list] = {}
    for r in records:
        if r.table in TABLE_COLUMNS and r.latency_ms > 0 and math.isfinite(r.latency_ms):
            cols = TABLE_COLUMNS[r.table]
            if len(r.key) != len(cols):
                raise ValueError(f"record for {r.table} has key {r.key}, needs {cols}")
            rows.setdefault(r.table, []).append(tuple(r.key) + (r.latency_ms,))
    out = {}
    for table, rs in rows.items():
        keys = list(TABLE_COLUMNS[table])
        df = pd.DataFrame(rs, columns=keys + ["latency_ms"])
        df = df.groupby(keys, as_index=False, sort=True)["latency_ms"].median()
        df["latency_ms"] = df["latency_ms"].map(_sig6)
        out[table] = df.sort_values(keys, kind="mergesort").reset_index(drop=True)
    return out


def extras_frame(records: list[Record], extras: list[dict]) -> pd.DataFrame:
    """Measurements the profile schema has no table for (sampling, the HF decode loop),
    long format: op, params ("name=value;..."), value, unit."""
    rows = [{"op": r.table, "params": ";".join(f"{n}={v}" for n, v in zip(("mode", "batch"), r.key)),
             "value": _sig6(r.latency_ms), "unit": "ms"} for r in records if r.table not in TABLE_COLUMNS]
    rows += extras
    return pd.DataFrame(rows, columns=["op", "params", "value", "unit"])


def box_name_or_dict(gpu: dict) -> tuple[str, dict | None]:
    """('h200-1x', None) for one H200 (a shipped preset), else ('box.toml', box) with a
    box written beside the profile: the measured copy bandwidth and bf16 GEMM rate,
    and, with several GPUs, a star of links at the measured P2P bandwidth."""
    count = int(gpu["count"])
    if count == 1 and "H200" in str(gpu["name"]):
        return "h200-1x", None
    bf16 = float(gpu["bf16_flops"])
    fp8 = 2.0 * bf16 if float(gpu.get("capability", 0)) >= 8.9 else bf16
    links = []
    if count > 1 and gpu.get("p2p_bw_bytes_s"):
        links = [{"child": f"gpu{i}", "parent": "fabric", "bw_gb_s": round(float(gpu["p2p_bw_bytes_s"]) / 1e9, 3),
                  "latency_us": round(float(gpu["p2p_latency_us"]) / 2, 3)} for i in range(count)]
    else:
        count = 1
    return "box.toml", {
        "name": f"live-{_slug(gpu['name'])}-{count}x",
        "description": (f"{count} x {gpu['name']} measured by pipesim calibrate live on {gpu['date']}: "
                        "copy bandwidth and bf16 GEMM rate measured; fp8 assumed 2x bf16 on compute "
                        "capability >= 8.9; links a star at the measured P2P bandwidth"),
        "gpu": {"name": str(gpu["name"]), "count": count, "memory_bytes": int(gpu["memory_bytes"]),
                "mem_bw_bytes_s": float(gpu["copy_bw_bytes_s"]), "flops_bf16": bf16, "flops_fp8": fp8,
                "flops_fp4": fp8},
        "topology": {"links": links},
    }


def _box_toml(box: dict) -> str:
    """TOML text of a box (links are an array of tables, which _toml.dumps does not write)."""
    from ..._toml import dumps

    top = {k: v for k, v in box.items() if k != "topology"}
    text = dumps(top) + "\n[topology]\n"
    if not box["topology"]["links"]:
        return text + "links = []\n"
    for link in box["topology"]["links"]:
        text += "\n[[topology.links]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in link.items())
    return text


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in str(text).lower()).split()) or "gpu"


def profile_meta(*, name: str, model_arg: str, gpu: dict, box: str, params: dict, param_sources: dict,
                 tables: list[str], reps: int, warmup: int, live: dict) -> dict:
    """profile.toml content: what was measured, on what, with what, and how."""
    stamp = (f"measured live by pipesim calibrate live on {gpu['name']} ({gpu['date']}), torch {gpu['torch']}, "
             f"CUDA {gpu['cuda']}, driver {gpu['driver']}, median of {reps} reps after {warmup} warm-up")
    how = {
        "gemm": "torch linear (cuBLAS) x[m, k] @ w[n, k]^T in bf16",
        "gqa_decode": ("one new token per request over `context` cached tokens, the query heads of each KV head "
                       "packed as a query block; the faster of torch scaled_dot_product_attention and a plain-torch "
                       "split-KV (flash-decoding) kernel sequence, which fills the GPU at small batch"),
        "gqa_prefill": "torch scaled_dot_product_attention, causal, `batch` prompts of `isl` tokens, no cached prefix",
        "mla_decode": ("plain torch absorbed MLA, split-KV: latent queries scored over the latent + rope cache, "
                       "softmax, weighted sum over the latent, chunks merged by log-sum-exp (unfused; the absorption "
                       "and output GEMMs are the gemm table's kv_b rows, as the cost model composes them)"),
        "mla_prefill": "torch scaled_dot_product_attention, causal, q/k head dim nope+rope, v padded to it",
        "moe": (f"routed experts only ({live.get('moe_impl', '')}): token slots sorted by expert, gate_up GEMM, "
                "SiLU x up, down GEMM, rows gathered back and summed with the top-k weights; balanced = uniform random top-k, power_law_1.01 = "
                "expert popularity ~ rank^-1.01, top-k drawn without replacement"),
        "collectives": ("torch.distributed NCCL, one process per GPU, groups of the first `gpus` GPUs; all_reduce "
                        "of nbytes, all_gather_into_tensor to nbytes in total; the slowest rank's median"),
        "p2p": "torch.distributed NCCL send/recv of nbytes from src_gpu to dst_gpu, timed on the receiver",
    }
    timing = ("CUDA events; CUDA-graph replay where capture succeeded, else eager; L2 flushed before every "
              "repetition; a GPU sleep kernel ahead of each repetition keeps CPU launch gaps out")
    known = {f.name for f in fields(Params)}
    return {
        "name": name,
        "description": (f"{model_arg} operation costs measured live on {gpu['count']} x {gpu['name']}; "
                        "scheduling model SGLang; CPU costs from the decode loop (see param_sources)"),
        "box": box,
        "engine": "sglang",
        "engine_version": "",
        "model": model_arg,
        "built_by": "pipesim calibrate live",
        "date": gpu["date"],
        "sources": {t: f"{stamp}; {how.get(t, '')}; {timing if t not in ('collectives', 'p2p') else 'CUDA events'}"
                    for t in tables},
        "params": {k: v for k, v in params.items() if k in known},
        "param_sources": {k: v for k, v in param_sources.items() if k in known},
        "gpu": gpu,
        "live": live,
    }


# ---- torch side -------------------------------------------------------------------------

def _import_torch():
    try:
        import torch
    except ImportError:
        raise UserError(NEEDS_TORCH) from None
    return torch


def require_cuda(torch) -> None:
    if not torch.cuda.is_available():
        raise UserError("no NVIDIA GPU is visible (torch.cuda.is_available() is False); "
                        "live calibration times CUDA kernels on the GPUs of this machine")


def _median(xs) -> float:
    return float(statistics.median(xs))


class _Bench:
    """Times operations on one device (see the module docstring). On a CPU device (the
    tests) it times wall clock, with no graphs, flush or sleep."""

    def __init__(self, torch, device, reps: int, warmup: int):
        self.torch, self.device, self.reps, self.warmup = torch, device, reps, warmup
        self.cuda = device.type == "cuda"
        self.flush = None
        self.cycles_per_us = 0.0
        self.l2_bytes = 0
        if self.cuda:
            props = torch.cuda.get_device_properties(device)
            self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
            self.flush = torch.empty(max(4 * self.l2_bytes, 256 * 2**20) // 4, dtype=torch.int32, device=device)
            self.cycles_per_us = self._sleep_rate()

    def _sleep_rate(self) -> float:
        """GPU clock cycles per microsecond of torch.cuda._sleep, measured (after a warm
        GPU has reached its clocks)."""
        torch = self.torch
        if not hasattr(torch.cuda, "_sleep"):
            return 0.0
        a = torch.randn(4096, 4096, device=self.device, dtype=torch.bfloat16)
        for _ in range(20):
            a @ a
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        e0.record()
        torch.cuda._sleep(cycles)
        e1.record()
        torch.cuda.synchronize()
        return cycles / max(e0.elapsed_time(e1) * 1e3, 1.0)

    def time_ms(self, make, graph: bool = True, reps: int | None = None) -> tuple[float, str]:
        """(median milliseconds of one call, method) of the closure that `make()` returns
        (a fresh one, with its own inputs, each time it is called)."""
        torch, reps = self.torch, reps or self.reps
        if not self.cuda:
            fn = make()
            for _ in range(self.warmup):
                fn()
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            return _median(times), "cpu"
        before = torch.cuda.memory_allocated(self.device)
        fns = [make()]
        working_set = torch.cuda.memory_allocated(self.device) - before
        copies = max(1, min(MAX_COPIES, math.ceil(COLD_FACTOR * self.l2_bytes / max(working_set, 1))))
        fns += [make() for _ in range(copies - 1)]

        def all_copies():
            for f in fns:
                f()
        for _ in range(self.warmup):
            all_copies()
        torch.cuda.synchronize()
        run, method = all_copies, "eager"
        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    all_copies()
                g.replay()
                torch.cuda.synchronize()
                run, method = g.replay, "graph"
            except Exception:  # capture is not possible for every op (host syncs, RNG): time eagerly
                torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        enqueue_us = (time.perf_counter() - t) * 1e6
        torch.cuda.synchronize()
        sleep = int(self.cycles_per_us * min(20_000.0, max(20.0, 3.0 * enqueue_us)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            # a read leaves clean lines in L2: the timed work pays no write-back for the flush
            self.flush.amax()
            if sleep:
                torch.cuda._sleep(sleep)
            starts[i].record()
            run()
            ends[i].record()
        torch.cuda.synchronize()
        return _median([s.elapsed_time(e) for s, e in zip(starts, ends)]) / copies, method

    def enqueue_us(self, fn, reps: int = 20) -> float:
        """CPU microseconds to launch fn's kernels, with the GPU held busy so that no
        launch waits for it (eager launch cost)."""
        torch = self.torch
        fn()
        times = []
        for _ in range(reps):
            if self.cuda:
                torch.cuda.synchronize()
                if self.cycles_per_us:
                    torch.cuda._sleep(int(self.cycles_per_us * 50_000))  # 50 ms: longer than any layer's launches
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
        if self.cuda:
            torch.cuda.synchronize()
        return _median(times)


class _Ops:
    """Builds the operation each Spec times as a factory: each call allocates fresh
    inputs of the model's shapes (random data, never zeros: zeros run faster than real
    data) and returns the closure to time."""

    def __init__(self, torch, device, model: Model):
        self.torch, self.device, self.model = torch, device, model
        self.F = torch.nn.functional
        self.dtype = torch.bfloat16
        self.moe_impl = None        # "grouped_mm" or "per-expert loop", chosen on first use
        self.sm_count = (torch.cuda.get_device_properties(device).multi_processor_count
                         if device.type == "cuda" else 4)

    def randn(self, *shape, scale: float = 1.0):
        x = self.torch.randn(*shape, device=self.device, dtype=self.dtype)
        return x.mul_(scale) if scale != 1.0 else x

    def build(self, spec: Spec):
        """The factory of the closure to time, or a list of alternative factories (the
        faster is kept)."""
        return getattr(self, spec.table)(*spec.key)

    def splits(self, blocks: int, context: int) -> int:
        """Context chunks for split-KV decode: enough (batch x heads x chunks) blocks to
        fill the GPU twice over, chunks of at least 256 tokens."""
        n = 1
        while blocks * n < 2 * self.sm_count and context % (2 * n) == 0 and context // (2 * n) >= 256:
            n *= 2
        return n

    # -- GEMM and attention ----------------------------------------------------------
    def gemm(self, dtype, m, n, k):
        def make():
            w, x = self.randn(n, k, scale=0.02), self.randn(m, k)
            return lambda: self.F.linear(x, w)
        return make

    def gqa_decode(self, heads, kv_heads, head_dim, batch, context):
        group = heads // kv_heads
        splits = self.splits(batch * kv_heads, context)

        def make(split: bool):
            q = self.randn(batch, kv_heads, group, head_dim)
            k = self.randn(batch, kv_heads, context, head_dim)
            v = self.randn(batch, kv_heads, context, head_dim)
            if split:
                return split_kv_attention(self.torch, q, k, v, head_dim ** -0.5, splits)
            # one new token per request sees the whole context: no mask
            return lambda: self.F.scaled_dot_product_attention(q, k, v)
        sdpa = lambda: make(False)  # noqa: E731
        return sdpa if splits == 1 else [sdpa, lambda: make(True)]

    def gqa_prefill(self, heads, kv_heads, head_dim, batch, isl):
        sdpa = self.F.scaled_dot_product_attention

        def make():
            q = self.randn(batch, heads, isl, head_dim)
            k = self.randn(batch, kv_heads, isl, head_dim)
            v = self.randn(batch, kv_heads, isl, head_dim)
            if heads == kv_heads:
                return lambda: sdpa(q, k, v, is_causal=True)
            try:
                sdpa(q[:, :, :1], k[:, :, :1], v[:, :, :1], is_causal=True, enable_gqa=True)
                return lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True)
            except TypeError:  # torch < 2.5: no enable_gqa; repeat the KV heads (prefill is compute-bound)
                rep = heads // kv_heads
                k2, v2 = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
                return lambda: sdpa(q, k2, v2, is_causal=True)
        return make

    def mla_decode(self, heads, batch, context):
        a = self.model.mla
        latent, rope = a.kv_lora_rank, a.qk_rope_head_dim
        scale = (a.qk_nope_head_dim + a.qk_rope_head_dim) ** -0.5

        def make():
            q = self.randn(batch, 1, heads, latent + rope)       # q_nope already absorbed into the latent
            cache = self.randn(batch, 1, context, latent + rope)  # c_kv and k_rope of each cached token
            # one latent KV "head" shared by all query heads; the values are the latent part
            return split_kv_attention(self.torch, q, cache, cache[..., :latent], scale, self.splits(batch, context))
        return make

    def mla_prefill(self, heads, batch, isl):
        a = self.model.mla
        d = a.qk_nope_head_dim + a.qk_rope_head_dim

        def make():
            q, k, v = (self.randn(batch, heads, isl, d) for _ in range(3))  # v (v_head_dim) padded to d
            return lambda: self.F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return make

    # -- MoE -----------------------------------------------------------------------------
    def moe(self, dtype, hidden, inter, topk, experts, moe_tp, distribution, tokens):
        torch = self.torch
        i = inter // moe_tp
        rng = np.random.default_rng(zlib.crc32(repr((distribution, tokens, experts, topk)).encode()))
        ids_np = route(tokens, experts, topk, distribution, rng)
        if self.moe_impl is None:
            self.moe_impl = self._pick_moe_impl()

        def make():
            w13, w2 = self.randn(experts, 2 * i, hidden, scale=0.02), self.randn(experts, hidden, i, scale=0.02)
            ids = torch.as_tensor(ids_np, device=self.device)
            gate = torch.softmax(self.randn(tokens, topk).float(), -1).to(self.dtype)
            x = self.randn(tokens, hidden)
            if self.moe_impl == "grouped_mm":
                return moe_grouped(torch, x, ids, gate, w13, w2)
            return moe_loop(torch, x, ids, gate, w13, w2, np.bincount(ids_np.ravel(), minlength=experts))
        return make

    def _pick_moe_impl(self) -> str:
        """torch's grouped GEMM (what SGLang-style fused MoE does: one launch for all
        experts, reading only the experts that got tokens) when this torch has it and it
        agrees with the per-expert loop; else the loop."""
        torch = self.torch
        if grouped_mm_fn(torch) is None:
            return "per-expert loop"
        try:
            g = torch.Generator(device=self.device).manual_seed(0)
            e, k, h, i, t = 8, 2, 64, 32, 37
            w13 = torch.randn(e, 2 * i, h, generator=g, device=self.device).to(self.dtype)
            w2 = torch.randn(e, h, i, generator=g, device=self.device).to(self.dtype)
            x = torch.randn(t, h, generator=g, device=self.device).to(self.dtype)
            ids_np = route(t, e, k, "balanced", np.random.default_rng(0))
            ids = torch.as_tensor(ids_np, device=self.device)
            gate = torch.full((t, k), 0.5, device=self.device, dtype=self.dtype)
            a = moe_grouped(torch, x, ids, gate, w13, w2)().float()
            b = moe_loop(torch, x, ids, gate, w13, w2, np.bincount(ids_np.ravel(), minlength=e))().float()
            ok = bool(((a - b).norm() / b.norm()).item() < 2e-2)
        except Exception:  # an unsupported shape, dtype or GPU: the loop is always there
            ok = False
        return "grouped_mm" if ok else "per-expert loop"

    # -- sampling -------------------------------------------------------------------------
    def sampling(self, mode, batch):
        torch = self.torch

        def make():
            logits = self.randn(batch, self.model.vocab)
            if mode == "greedy":
                return lambda: torch.argmax(logits, dim=-1)
            return lambda: torch.multinomial(torch.softmax(logits.float() / 0.7, dim=-1), 1)
        return make


def grouped_mm_fn(torch):
    """torch's grouped GEMM (public from 2.10, private since 2.8), or None."""
    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def split_kv_attention(torch, q, k, v, scale: float, splits: int):
    """Decode attention the way flash-decoding does it, unfused: the context cut into
    `splits` chunks attended in parallel (so a small batch still fills the GPU), then
    merged by each chunk's log-sum-exp. q (b, h, g, d): the g query heads that share
    KV head h; k (b, h, ctx, d); v (b, h, ctx, dv), which may be a strided view."""
    b, h, g, _ = q.shape
    c = k.shape[2] // splits
    k5 = k.unflatten(2, (splits, c))
    v5 = v.unflatten(2, (splits, c))

    def attend():
        s = torch.matmul(q.unsqueeze(2), k5.transpose(-1, -2)).float().mul_(scale)   # (b, h, S, g, c)
        lse = torch.logsumexp(s, -1, keepdim=True)
        o = torch.matmul(torch.exp(s - lse).to(q.dtype), v5)                           # (b, h, S, g, dv)
        w = torch.softmax(lse, dim=2)                                                   # each chunk's share
        return (o * w).sum(2).to(q.dtype)
    return attend


def _combine(torch, y, order, gate, tokens: int):
    """Each token's top-k expert outputs, weighted and summed: gather the sorted rows back
    to token order and reduce with one batched GEMV (no atomics, as engines' moe_sum)."""
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    topk = gate.shape[1]
    rows = y.index_select(0, inverse).view(tokens, topk, -1)
    return torch.bmm(gate.view(tokens, 1, topk).to(rows.dtype), rows).view(tokens, -1)


def moe_grouped(torch, x, ids, gate, w13, w2):
    """Routed experts with one grouped GEMM per projection. Everything stays on the
    GPU (no host sync), so the layer can be captured in a CUDA graph."""
    gmm = grouped_mm_fn(torch)
    experts, two_i, _ = w13.shape
    i = two_i // 2
    tokens, topk = ids.shape
    F = torch.nn.functional
    ones = torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)

    def layer():
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.zeros(experts, dtype=torch.int32, device=ids.device).scatter_add_(0, flat, ones)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xs = x.index_select(0, order // topk)
        gu = gmm(xs, w13.transpose(1, 2), offs=offs)
        y = gmm(F.silu(gu[:, :i]) * gu[:, i:], w2.transpose(1, 2), offs=offs)
        return _combine(torch, y, order, gate, tokens)
    return layer


def moe_loop(torch, x, ids, gate, w13, w2, counts):
    """Routed experts as one GEMM pair per expert that received tokens (the fallback
    where torch has no grouped GEMM): reads only the touched experts' weights."""
    i = w13.shape[1] // 2
    tokens, topk = ids.shape
    F = torch.nn.functional
    bounds = np.concatenate(([0], np.cumsum(counts)))
    segments = [(e, int(bounds[e]), int(bounds[e + 1])) for e in range(len(counts)) if counts[e]]

    def layer():
        order = torch.argsort(ids.reshape(-1), stable=True)
        xs = x.index_select(0, order // topk)
        ys = torch.empty_like(xs)
        for e, a, b in segments:
            gu = F.linear(xs[a:b], w13[e])
            ys[a:b] = F.linear(F.silu(gu[:, :i]) * gu[:, i:], w2[e])
        return _combine(torch, ys, order, gate, tokens)
    return layer


# ---- the decode loop's CPU costs ----------------------------------------------------------

def plain_layer_launch_us(torch, bench: _Bench, ops: _Ops, model: Model) -> float:
    """CPU time to launch one decoder layer at batch 1, eagerly, written in plain torch
    from the same operations as the tables (norms, QKV, rope, attention, O, MLP or
    router + MoE): the launch cost of a minimal eager layer."""
    m = model
    x = ops.randn(1, m.hidden)
    norm_w = ops.randn(m.hidden)

    def rmsnorm(h):
        v = h.float().pow(2).mean(-1, keepdim=True)
        return (h.float() * torch.rsqrt(v + 1e-6)).to(ops.dtype) * norm_w

    fns = []
    if m.mla:
        a = m.mla
        fns += [ops.gemm("bf16", 1, a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim, m.hidden)(),
                ops.gemm("bf16", 1, m.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim), a.q_lora_rank or m.hidden)(),
                ops.gemm("bf16", 1, m.heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank)(),
                ops.mla_decode(m.heads, 1, 256)()]
        o_in = m.heads * a.v_head_dim
    else:
        attention = ops.gqa_decode(m.heads, m.kv_heads, m.head_dim, 1, 256)
        fns += [ops.gemm("bf16", 1, (m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden)(),
                (attention[0] if isinstance(attention, list) else attention)()]
        o_in = m.heads * m.head_dim
    q = ops.randn(1, m.heads, m.head_dim if not m.mla else m.mla.qk_rope_head_dim)
    cos, sin = ops.randn(q.shape[-1]), ops.randn(q.shape[-1])

    def rope():
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin
    fns += [rope, ops.gemm("bf16", 1, m.hidden, o_in)()]
    if m.moe:
        mo = m.moe
        router = ops.gemm("bf16", 1, mo.n_routed_experts, m.hidden)()
        fns += [lambda: torch.topk(torch.softmax(router().float(), -1), mo.topk, -1),
                ops.moe("bf16", m.hidden, mo.moe_intermediate, mo.topk, mo.n_routed_experts, 1, "balanced", 1)()]
    else:
        gu = ops.gemm("bf16", 1, 2 * m.intermediate, m.hidden)()
        fns += [lambda: (lambda t: ops.F.silu(t[:, :m.intermediate]) * t[:, m.intermediate:])(gu()),
                ops.gemm("bf16", 1, m.hidden, m.intermediate)()]

    def layer():
        h = rmsnorm(x)
        for f in fns:
            f()
        return rmsnorm(x + h)
    return bench.enqueue_us(layer)


def graph_loop_floor_ms(torch, device, reps: int = 200) -> float:
    """Per-iteration wall time of the least a CUDA-graph decode loop does: replay a
    graph, take the argmax token, copy it to the host (one sync) and append it. The
    floor of an engine's per-iteration CPU cost; its scheduler adds Python on top."""
    x = torch.randn(1, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(1024, 256, device=device, dtype=torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    torch.nn.functional.linear(x, w)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        out = torch.nn.functional.linear(x, w)
    tokens, times = [], []
    for _ in range(reps + 10):
        t = time.perf_counter()
        g.replay()
        tokens.append(out.argmax(-1).tolist())
        times.append((time.perf_counter() - t) * 1e3)
    return _median(times[10:])


# ---- Hugging Face transformers ----------------------------------------------------------

def hf_config_dict(model_arg: str) -> dict:
    """The HF config dict behind a preset name or a config.json path."""
    from importlib import resources

    from ...model import preset_names

    if model_arg in preset_names():
        raw = resources.files("pipesim.data").joinpath("models").joinpath(f"{model_arg}.json").read_text()
    else:
        p = Path(model_arg)
        raw = (p / "config.json" if p.is_dir() else p).read_text()
    return json.loads(raw)


def transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        return "none"
    return transformers.__version__


def hf_transformers_config(cfg: dict, layers: int | None = None):
    """The transformers config for an HF config dict (quantization dropped: the weights
    are random bf16), or a UserError saying why transformers cannot build it."""
    try:
        import transformers
    except ImportError:
        raise UserError("--hf-config needs transformers: pip install 'pipesim[live]'") from None
    raw = {k: v for k, v in cfg.items() if not k.startswith("_") and k not in ("quantization_config", "torch_dtype")}
    text = raw.pop("text_config", None)
    if isinstance(text, dict):  # multimodal wrappers: the text model is what is served per token
        raw = {**{k: v for k, v in text.items() if not k.startswith("_")}, "model_type": text.get("model_type", "")}
    model_type = raw.pop("model_type", None)
    if not model_type:
        raise UserError("--hf-config: the model config has no 'model_type', so transformers cannot build it")
    if layers is not None:
        raw["num_hidden_layers"] = layers
        raw.pop("layer_types", None)
        if isinstance(raw.get("mlp_only_layers"), list):
            raw["mlp_only_layers"] = [i for i in raw["mlp_only_layers"] if i < layers]
    try:
        return transformers.AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError) as exc:
        raise UserError(f"--hf-config: transformers {transformers.__version__} cannot build model_type "
                        f"'{model_type}' ({str(exc).splitlines()[0][:120]})") from None


def build_hf_model(cfg: dict, device, *, layers: int | None = None):
    """A transformers causal LM built from an HF config dict with random weights (no
    download), bf16, on `device`, in eval mode. `layers` overrides the depth."""
    torch = _import_torch()
    import transformers

    config = hf_transformers_config(cfg, layers)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        except TypeError:  # transformers 4.x spells it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.to(device=device, dtype=torch.bfloat16).eval()
    gc = model.generation_config
    gc.eos_token_id = None          # never stop early: every run decodes exactly the asked tokens
    gc.pad_token_id = 0
    return model


def generate_once_s(model, batch: int, prompt: int, new_tokens: int, seed: int = 0) -> float:
    """Wall seconds of one `generate` call: greedy, `new_tokens` tokens for each of
    `batch` random prompts of `prompt` tokens, no early stop."""
    torch = _import_torch()
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, model.config.vocab_size, (batch, prompt), generator=g).to(device)
    mask = torch.ones_like(ids)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    sync()
    seconds = time.perf_counter() - t
    got = (out.sequences if hasattr(out, "sequences") else out).shape[1] - prompt
    if got != new_tokens:
        raise RuntimeError(f"generate stopped after {got} of {new_tokens} tokens")
    return seconds


def kernel_ms(torch, run) -> float | None:
    """Milliseconds the GPU spent in kernels while `run()` ran (torch.profiler, CUPTI),
    or None where the profiler records no GPU activity."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        total_us = 0.0
        for e in prof.key_averages():
            v = getattr(e, "self_device_time_total", None)
            total_us += float(v if v is not None else getattr(e, "self_cuda_time_total", 0.0))
    except Exception:  # no CUPTI, or a profiler that does not start: report nothing rather than a wrong number
        return None
    return total_us / 1e3 if total_us > 0 else None


def step_wall_ms(model, batch: int, prompt: int, short: int = 8, long: int = 40) -> float:
    """Wall ms of one decode iteration of `generate` at `batch`: a `long` minus a `short`
    run over the extra tokens, which cancels prefill and set-up."""
    return (generate_once_s(model, batch, prompt, long) - generate_once_s(model, batch, prompt, short)) \
        * 1e3 / (long - short)


def step_kernel_ms(model, batch: int, prompt: int, short: int = 8, long: int = 40) -> float | None:
    """GPU kernel ms of one decode iteration (profiler), the same difference."""
    torch = _import_torch()
    k_long = kernel_ms(torch, lambda: generate_once_s(model, batch, prompt, long))
    k_short = kernel_ms(torch, lambda: generate_once_s(model, batch, prompt, short))
    return None if k_long is None or k_short is None else (k_long - k_short) / (long - short)


def hf_step(model, batch: int, prompt: int, short: int = 8, long: int = 40, repeats: int = 5,
            with_kernels: bool = True) -> tuple[float, float | None]:
    """(wall ms, GPU kernel ms) of one decode iteration of `generate` at `batch`,
    the median of `repeats` after two warm-up calls."""
    for _ in range(2):      # warm-up: kernel selection, allocator, generate's first-call set-up
        generate_once_s(model, batch, prompt, short)
    wall = _median([step_wall_ms(model, batch, prompt, short, long) for _ in range(repeats)])
    return wall, (step_kernel_ms(model, batch, prompt, short, long) if with_kernels else None)


def hf_weight_bytes(model: Model) -> float:
    """Bytes of a random-weight HF model of `model` (bf16 everywhere, untied embeddings)."""
    return sum(_bf16_layer_bytes(model, i) for i in range(model.num_layers)) + 4.0 * model.vocab * model.hidden


def _bf16_layer_bytes(model: Model, layer: int) -> float:
    """One decoder layer's weights as a random-weight HF model holds them (bf16)."""
    params = model.attention_params()
    if model.is_moe_layer(layer):
        mo = model.moe
        params += (mo.n_routed_experts + mo.n_shared_experts) * model.expert_params() + model.hidden * mo.n_routed_experts
    else:
        params += model.dense_mlp_params()
    return 2.0 * params


def hf_decode_costs(cfg: dict, model: Model, device, grids: Grids, deadline: float, log,
                    repeats: int = 5) -> tuple[dict, list[dict]]:
    """The decode loop's CPU costs from the model's HF implementation.

    Two random-weight models that differ only in depth (La and Lb decoder layers) run
    `generate`, their runs interleaved so that drift in the machine's speed hits both
    alike. At small batch an eager HF decode step is launch-bound (the CPU issues
    kernels more slowly than the GPU runs them: the profiler's kernel time per layer
    is a fraction of the wall time per layer), so the step's wall time is CPU time.
    Its slope over depth is the launch time per decoder layer
    (eager_launch_us_per_layer); the intercept is the per-iteration cost outside the
    layers: generate's Python, embedding, lm_head and sampling launches, the host sync
    (cpu_iteration_ms). Both are taken at the first (smallest) batch size, where the
    step is most purely CPU-bound; larger batches are recorded in the extras (on the
    lent H200 their slopes scattered 0.7-1.2 ms/layer for Llama-8B, batch 1 was the
    one that extrapolated to the full-depth model best). The simulator
    composes an eager step as cpu_iteration_ms + max(GPU time, layers x launch time),
    which is this measurement's own model."""
    torch = _import_torch()
    first = model.moe.first_k_dense if model.moe else 0
    layer_bytes = max(_bf16_layer_bytes(model, i) for i in range(min(model.num_layers, first + 1)))
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 8 * 2**30
    la = min(first + 1, model.num_layers)
    room = int(0.6 * free // max(layer_bytes, 1)) - 2 * la       # both models stay resident
    lb = min(la + max(1, min(HF_EXTRA_LAYERS, room)), model.num_layers)
    if lb == la:
        raise UserError(f"--hf-config: {model.name} has one layer, so launch time per layer cannot be separated")
    models = {d: build_hf_model(cfg, device, layers=d) for d in (la, lb)}
    impl = (str(getattr(models[la].config, "_attn_implementation", "")),
            str(getattr(models[la].config, "_experts_implementation", "")) if model.moe else "")
    rows: list[dict] = []
    seen: dict = {}
    for b in grids.hf_batches:
        if seen and time.monotonic() > deadline:
            log(f"HF batch {b}: skipped (budget)")
            continue
        for m in models.values():       # warm-up: kernel selection, allocator growth, first-call set-up
            for n in (8, 40):
                generate_once_s(m, b, grids.hf_prompt, n)
        walls: dict = {la: [], lb: []}
        for _ in range(repeats + (2 if not seen else 0)):       # the batch the parameters come from: more
            for d in (la, lb):
                walls[d].append(step_wall_ms(models[d], b, grids.hf_prompt))
        slope = _median([(wb - wa) / (lb - la) for wa, wb in zip(walls[la], walls[lb])])
        wall_a = _median(walls[la])
        ka, kb = (step_kernel_ms(models[d], b, grids.hf_prompt) for d in (la, lb))
        k_layer = None if ka is None or kb is None else (kb - ka) / (lb - la)
        seen[b] = (wall_a, slope, ka, kb, k_layer)
        params = f"batch={b};context={grids.hf_prompt};layers={la}->{lb}"
        rows.append({"op": "hf_layer_wall", "params": params, "value": _sig6(slope), "unit": "ms"})
        if k_layer is not None:
            rows.append({"op": "hf_layer_kernels", "params": params, "value": _sig6(k_layer), "unit": "ms"})
        rows.append({"op": "hf_step_wall", "params": f"batch={b};context={grids.hf_prompt};layers={la}",
                     "value": _sig6(wall_a), "unit": "ms"})
    del models
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bound = list(seen)[:1]
    per_layer_ms = seen[bound[0]][1]
    if per_layer_ms <= 0:
        log(f"HF decode step did not grow with depth ({la} -> {lb} layers): timing noise; "
            "eager_launch_us_per_layer set to 0")
        per_layer_ms = 0.0
    fixed_ms = max(_median([seen[b][0] - la * per_layer_ms for b in bound]), 0.0)
    b0 = list(seen)[0]
    costs = {"cpu_iteration_ms": round(fixed_ms, 4), "eager_launch_us_per_layer": round(per_layer_ms * 1e3, 2),
             "layers": (la, lb), "batches": bound, "impl": impl,
             "step_ms": (round(seen[b0][0], 4), round(seen[b0][0] + (lb - la) * seen[b0][1], 4)),
             "kernel_ms": tuple(None if k is None else round(k, 4) for k in seen[b0][2:4])}
    return costs, rows


# ---- collectives and P2P (one process per GPU) ---------------------------------------------

def _comm_worker(rank: int, world: int, init_file: str, backend: str, sizes: tuple, reps: int, warmup: int,
                 timeout_s: float, out_dir: str, pairs: tuple) -> None:
    """One rank: every group size's all-reduce and all-gather, then P2P between pairs.
    Rows go to out_dir/rank<r>.jsonl as they are measured (a run cut short keeps them)."""
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=timeout_s))
    out = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a")

    def timed(op) -> float:
        for _ in range(warmup):
            op()
        if not cuda:
            ts = []
            for _ in range(reps):
                t = time.perf_counter()
                op()
                ts.append((time.perf_counter() - t) * 1e3)
            return _median(ts)
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in ev:
            a.record()
            op()
            b.record()
        torch.cuda.synchronize()
        return _median([a.elapsed_time(b) for a, b in ev])

    def emit(row):
        out.write(json.dumps(row) + "\n")
        out.flush()

    try:
        groups = {g: dist.new_group(list(range(g))) for g in range(2, world + 1)}   # every rank, same order
        for g, grp in groups.items():
            for nbytes in sizes:
                n = -(-(nbytes // 2) // g) * g            # bf16 elements, divisible by the group
                for op in ("all_reduce", "all_gather"):
                    if rank < g:
                        x = torch.randn(n if op == "all_reduce" else n // g, device=dev).to(torch.bfloat16)
                        y = torch.empty(n, device=dev, dtype=torch.bfloat16)
                        fn = ((lambda: dist.all_reduce(x, group=grp)) if op == "all_reduce"
                              else (lambda: dist.all_gather_into_tensor(y, x, group=grp)))
                        t = torch.tensor([timed(fn)], device=dev, dtype=torch.float64)
                        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=grp)
                        if rank == 0:
                            emit({"table": "collectives", "key": [op, "nccl" if cuda else backend, g, 2 * n],
                                  "ms": float(t.item())})
            dist.barrier()
        for src, dst in pairs:
            for nbytes in sizes:
                if rank in (src, dst):
                    x = torch.randn(max(nbytes // 2, 1), device=dev).to(torch.bfloat16)
                    if rank == src:
                        for _ in range(warmup + reps):
                            dist.send(x, dst)
                    else:
                        ms = timed(lambda: dist.recv(x, src))
                        emit({"table": "p2p", "key": [src, dst, 2 * x.numel()], "ms": ms})
                if cuda:
                    torch.cuda.synchronize()
            dist.barrier()
    finally:
        out.close()
        dist.destroy_process_group()


def measure_comm(world: int, grids: Grids, reps: int, warmup: int, limit_s: float,
                 backend: str = "nccl") -> tuple[list[Record], str]:
    """Collectives and P2P with one process per GPU (torch.multiprocessing, spawn).
    A peer that never joins or hangs fails within `limit_s`: the processes started
    here are stopped and what was measured so far is kept. Returns (records, note)."""
    import tempfile

    import torch.multiprocessing as mp

    pairs = tuple((i, j) for i in range(world) for j in range(i + 1, world))
    note = "complete"
    with tempfile.TemporaryDirectory(prefix="pipesim-comm-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        timeout_s = max(30.0, min(limit_s, 300.0))
        ctx = mp.start_processes(_comm_worker, args=(world, init_file, backend, grids.comm_bytes, reps, warmup,
                                                     timeout_s, tmp, pairs),
                                 nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + limit_s
        try:
            while not ctx.join(timeout=2):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    note = f"cut at the {limit_s:.0f} s limit"
                    break
        except Exception as exc:  # a rank failed (a peer never joined, NCCL error): keep what was written
            note = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"
        records = []
        for r in range(world):
            f = Path(tmp) / f"rank{r}.jsonl"
            if f.is_file():
                for line in f.read_text().splitlines():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by a stopped process
                    records.append(Record(row["table"], tuple(row["key"]), row["ms"], "events"))
    return records, note


# ---- the GPU and the run ----------------------------------------------------------------

def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # NVML missing: ask nvidia-smi
        pass
    import subprocess

    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_info(torch, bench: _Bench) -> dict:
    """Name, count, versions and two measured ceilings of the visible GPUs."""
    dev = bench.device
    props = torch.cuda.get_device_properties(dev)

    def timed(make):
        ms, _ = bench.time_ms(make, graph=False, reps=10)
        torch.cuda.empty_cache()
        return ms

    def copy():
        src = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=dev).normal_()
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    def matmul():
        a, b = (torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) for _ in range(2))
        return lambda: a @ b
    copy_ms, mm_ms = timed(copy), timed(matmul)
    return {
        "name": torch.cuda.get_device_name(dev),
        "count": torch.cuda.device_count(),
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "capability": float(f"{props.major}.{props.minor}"),
        "sm_count": int(props.multi_processor_count),
        "memory_bytes": int(props.total_memory),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
        "copy_bw_bytes_s": _sig6(2 * 2**30 / (copy_ms * 1e-3)),           # read + write
        "bf16_flops": _sig6(2 * 8192**3 / (mm_ms * 1e-3)),
        "date": dt.date.today().isoformat(),
    }


def _progress(items, desc: str):
    """tqdm over items when tqdm is installed (the live extra), else the items."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="op", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


def _log(msg: str) -> None:
    try:
        from tqdm import tqdm

        tqdm.write(f"pipesim: {msg}", file=sys.stderr)
    except ImportError:
        print(f"pipesim: {msg}", file=sys.stderr)


def measure_specs(specs: list[Spec], ops: _Ops, bench: _Bench, deadline: float, desc: str) -> tuple[list[Record], dict]:
    """Time each spec; optional ones are skipped once past `deadline`; a spec that
    fails (out of memory for a huge shape) is logged and skipped, not fatal."""
    torch = ops.torch
    records, stats = [], {"skipped": 0, "failed": 0, "graph": 0, "eager": 0}
    last = None
    for spec in _progress(specs, desc):
        if not spec.required and time.monotonic() > deadline:
            stats["skipped"] += 1
            continue
        if spec.table != last and bench.cuda:
            torch.cuda.empty_cache()   # another kind of op: give its big inputs unfragmented memory
        last = spec.table
        try:
            built = ops.build(spec)
            # sampling draws random numbers and may sync: it is timed eagerly
            timed = [bench.time_ms(make, graph=spec.table != "sampling") for make in
                     (built if isinstance(built, list) else [built])]
            ms, method = min(timed)
            del built
        except (RuntimeError, MemoryError) as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
            stats["failed"] += 1
            if stats["failed"] <= 5:
                _log(f"{spec.table} {spec.key}: not measured ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
            if bench.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            continue
        stats[method] = stats.get(method, 0) + 1
        records.append(Record(spec.table, spec.key, ms, method))
    return records, stats


def _write(out: Path, meta: dict, records: list[Record], extras: list[dict], box: dict | None) -> Path:
    tables = tables_from_records(records)
    meta = dict(meta, sources={t: meta["sources"].get(t, "") for t in tables})
    df = extras_frame(records, extras)
    files = {"live_extras.csv": df.to_csv(index=False)} if len(df) else {}
    if box is not None:
        files["box.toml"] = _box_toml(box)
    return write_profile(out, meta, tables, extra=files)


def run_live(model_arg: str, out: str | Path, *, hf_config: bool = False, name: str | None = None,
             budget_s: float = 420.0, reps: int = 30, warmup: int = 5, collectives: bool = True,
             grids: Grids = Grids(), device: str = "cuda") -> Path:
    """Measure and write the profile (see the module docstring). `device="cpu"` runs
    the same code with wall-clock timing (for tests; the CLI insists on a GPU)."""
    torch = _import_torch()
    if device == "cuda":
        require_cuda(torch)
    if reps < 3 or warmup < 1 or budget_s <= 0:
        raise UserError(f"need --reps >= 3, --warmup >= 1 and --budget-s > 0 (got {reps}, {warmup}, {budget_s})")
    model = load_model(model_arg)
    cfg = hf_config_dict(model_arg) if hf_config else None
    if cfg is not None:
        hf_transformers_config(cfg)   # fail now, not after minutes of measuring, if transformers cannot build it
    t0 = time.monotonic()
    deadline = t0 + budget_s - WRITE_RESERVE_S
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    bench = _Bench(torch, dev, reps, warmup)
    if device == "cuda":
        gpu = gpu_info(torch, bench)
    else:
        gpu = {"name": "cpu", "count": 1, "driver": "none", "torch": torch.__version__, "cuda": "none",
               "capability": 0.0, "sm_count": 0, "memory_bytes": 2**34, "l2_bytes": 0,
               "copy_bw_bytes_s": 1e10, "bf16_flops": 1e11, "date": dt.date.today().isoformat()}
    _log(f"live calibration of {model.name} on {gpu['count']} x {gpu['name']} (torch {gpu['torch']}, "
         f"CUDA {gpu['cuda']}, driver {gpu['driver']}), budget {budget_s:.0f} s")
    ops = _Ops(torch, dev, model)
    specs = plan_specs(model, grids)
    required = [s for s in specs if s.required]
    optional = [s for s in specs if not s.required]
    records, stats = measure_specs(required, ops, bench, deadline, "required ops")
    _log(f"{len(records)} required operations timed ({stats['graph']} as CUDA graphs) at "
         f"{time.monotonic() - t0:.0f} s")

    # the decode loop's CPU costs
    params: dict = {}
    sources: dict = {}
    extras: list[dict] = []
    launch_us = plain_layer_launch_us(torch, bench, ops, model)
    floor_ms = graph_loop_floor_ms(torch, dev) if device == "cuda" else 0.0
    extras += [{"op": "plain_layer_launch", "params": "batch=1", "value": _sig6(launch_us / 1e3), "unit": "ms"},
               {"op": "graph_loop_floor", "params": "batch=1", "value": _sig6(floor_ms), "unit": "ms"}]
    live: dict = {"reps": reps, "warmup": warmup, "budget_s": budget_s, "model": model.name,
                  "moe_impl": ops.moe_impl or "", "hf_config": hf_config}
    if cfg is not None:
        costs, rows = hf_decode_costs(cfg, model, dev, grids, deadline, _log)
        _log(f"HF decode loop: {costs['cpu_iteration_ms']} ms per step + {costs['eager_launch_us_per_layer']} us "
             f"per layer (models of {costs['layers'][0]} and {costs['layers'][1]} layers) at "
             f"{time.monotonic() - t0:.0f} s")
        extras += rows
        params["cpu_iteration_ms"] = costs["cpu_iteration_ms"]
        params["eager_launch_us_per_layer"] = costs["eager_launch_us_per_layer"]
        la, lb = costs["layers"]
        how = (f"HF transformers {transformers_version()} generate (random weights, bf16, greedy, attention "
               f"{costs['impl'][0]}{', experts ' + costs['impl'][1] if costs['impl'][1] else ''}), models of {la} "
               f"and {lb} decoder layers run interleaved, medians at batch {costs['batches'][0]}: a step took "
               f"{costs['step_ms'][0]} / {costs['step_ms'][1]} ms")
        sources["cpu_iteration_ms"] = f"measured: intercept over depth of the eager decode step; {how}"
        sources["eager_launch_us_per_layer"] = f"measured: slope over depth of the eager decode step; {how}"
        live.update(hf_layers=list(costs["layers"]), hf_step_ms=list(costs["step_ms"]),
                    hf_kernel_ms=[k if k is not None else -1 for k in costs["kernel_ms"]],
                    hf_attention=costs["impl"][0], hf_experts=costs["impl"][1], hf_transformers=transformers_version())
    else:
        params["cpu_iteration_ms"] = round(floor_ms, 4)
        params["eager_launch_us_per_layer"] = round(launch_us, 2)
        sources["cpu_iteration_ms"] = ("measured floor of a CUDA-graph decode loop (replay, argmax, token to host); "
                                       "an engine's scheduler adds its own Python on top")
        sources["eager_launch_us_per_layer"] = ("measured: CPU time to launch one plain-torch decoder layer at "
                                                "batch 1 (the table operations, eagerly)")
    floor_ms, _ = bench.time_ms(ops.gemm("bf16", 1, 64, 64))
    params["kernel_floor_us"] = round(floor_ms * 1e3, 3)
    sources["kernel_floor_us"] = "measured: a 1 x 64 x 64 bf16 GEMM, the shortest kernel (launch + tail)"
    if model.moe:
        params["moe_distribution"] = "power_law_1.01"
        sources["moe_distribution"] = ("both measured; real routing is skewed (physics.md §2): power_law_1.01 "
                                       "rows; a random-weight model routes near-uniformly: read 'balanced' for it")

    box_name, box = box_name_or_dict(gpu)
    prof_name = name or f"live-{_slug(gpu['name'])}-{_slug(model.name)}"
    out = Path(out)

    def save(stage: str) -> Path:
        tables = sorted({r.table for r in records if r.table in TABLE_COLUMNS})
        live_now = dict(live, stage=stage, elapsed_s=round(time.monotonic() - t0, 1),
                        skipped_optional=stats["skipped"], failed=stats["failed"],
                        graph_ops=stats.get("graph", 0), eager_ops=stats.get("eager", 0))
        meta = profile_meta(name=prof_name, model_arg=model_arg, gpu=gpu, box=box_name, params=params,
                            param_sources=sources, tables=tables, reps=reps, warmup=warmup, live=live_now)
        return _write(out, meta, records, extras, box)

    path = save("single-GPU tables")
    if gpu["count"] > 1 and collectives:
        limit = max(60.0, deadline - time.monotonic())
        _log(f"collectives and P2P over {gpu['count']} GPUs (at most {limit:.0f} s)")
        comm, note = measure_comm(gpu["count"], grids, reps=max(10, reps // 2), warmup=warmup, limit_s=limit)
        records += comm
        live["collectives"] = note
        p2p = [r for r in comm if r.table == "p2p"]
        if p2p:
            big = max(r.key[2] for r in p2p)
            gpu["p2p_bw_bytes_s"] = _sig6(_median([r.key[2] / (r.latency_ms * 1e-3) for r in p2p if r.key[2] == big]))
            small = min(r.key[2] for r in p2p)
            gpu["p2p_latency_us"] = _sig6(_median([r.latency_ms * 1e3 for r in p2p if r.key[2] == small]))
            box_name, box = box_name_or_dict(gpu)
        if note != "complete":
            _log(f"collectives {note}; the single-GPU tables are kept")
        path = save("collectives")
    more, more_stats = measure_specs(optional, ops, bench, deadline, "optional extras")
    records += more
    for k, v in more_stats.items():
        stats[k] = stats.get(k, 0) + v
    if stats["skipped"]:
        _log(f"budget: {stats['skipped']} optional measurements skipped (see [live] in profile.toml)")
    path = save("complete")
    _log(f"wrote {path} in {time.monotonic() - t0:.0f} s")
    return path

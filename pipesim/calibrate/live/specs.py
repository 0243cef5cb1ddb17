"""What to measure: the sizes (`Grids`), one measurement (`Spec`) and its result
(`Record`), and the plan of every measurement for a model. Pure: no torch, no GPU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...base.errors import UserError
from ...inputs.box import Box
from ...inputs.model import Model
from ...inputs.quantization import WeightFormat
from ...profiles.profile import Params, Profile
from ...profiles.tables import Tables

MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01")


@dataclass(frozen=True)
class Grids:
    """Sizes to measure. Defaults cover what the simulator asks for typical loads
    (decode batches up to 256, contexts to 32k, prompts to 16k tokens) and fit one
    GPU's budget; interpolation (interp.py) fills between points, proportional
    scaling beyond the largest."""

    m: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    decode_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    decode_context: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    decode_max_tokens: int = 2**20  # batch x context cap (a 4-8 GB KV cache)
    prefill_isl: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    prefill_batch_extra: tuple[int, ...] = (2, 4, 8)  # optional, prompts up to 4096
    moe_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    sampling_batch: tuple[int, ...] = (1, 8, 64, 256)
    tps: tuple[int, ...] = (1, 2, 4, 8)  # tp > 1 shapes (per-GPU slices) are optional extras
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
    """One measurement's result: the Spec's table and key, and its latency."""

    table: str
    key: tuple
    latency_ms: float
    method: str = ""  # "graph", "eager", "cpu"


def _probe_box() -> Box:
    """An 8-GPU box, only so that the cost model can be asked which shapes it needs."""
    from ...inputs.box import box_from_dict

    links = [{"child": f"gpu{i}", "parent": "switch", "bw_gb_s": 100.0, "latency_us": 1.0} for i in range(8)]
    return box_from_dict(
        {
            "name": "probe",
            "gpu": {
                "name": "probe",
                "count": 8,
                "memory_bytes": 1e12,
                "mem_bw_bytes_s": 1e12,
                "flops_bf16": 1e15,
            },
            "topology": {"links": links},
        },
        "probe",
    )


def gemm_shapes(model: Model, tp: int) -> list[tuple[int, int]]:
    """The (n, k) of every GEMM the cost model asks for on one GPU at tensor
    parallelism `tp` (attention projections, dense MLP, router, shared expert,
    lm_head), read off `CostModel.stage_ops` itself so the two cannot drift apart."""
    from ...costs.primitives import Shape
    from ...costs.stage import CostModel
    from ...inputs.plan import Plan

    empty = Profile("probe", "probe", "sglang", "", Params(), {}, Tables())
    seen: list[tuple[int, int]] = []

    class GemmShapeCollector(CostModel):
        """A cost model that notes the (n, k) of every GEMM it is asked for."""

        def gemm(self, m: int, n: int, k: int, dtype: WeightFormat | str) -> tuple[float, str]:
            if (n, k) not in seen:
                seen.append((n, k))
            return 1e-6, "table"

    cm = GemmShapeCollector(_probe_box(), model, Plan(tp, 1, (model.num_layers,)), empty)
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
        dec_key: tuple[int, ...]
        pre_key: tuple[int, ...]
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
            opt.extend(
                Spec(pre, pre_key + (b, isl), False)
                for b in grids.prefill_batch_extra
                for isl in grids.prefill_isl
                if isl <= 4096
            )
    if model.moe:
        mo = model.moe
        for tp in tps:
            if mo.moe_intermediate % tp:
                continue
            out = req if tp == 1 else opt
            for dist in MOE_DISTRIBUTIONS:
                out.extend(
                    Spec(
                        "moe",
                        (
                            "bf16",
                            model.hidden,
                            mo.moe_intermediate,
                            mo.topk,
                            mo.n_routed_experts,
                            tp,
                            dist,
                            t,
                        ),
                        tp == 1,
                    )
                    for t in grids.moe_tokens
                )
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
        alpha = float(distribution[len("power_law_") :])
        logp = -alpha * np.log(rng.permutation(experts) + 1.0)
    else:
        raise UserError(
            f"unknown routing distribution '{distribution}'; known: {', '.join(MOE_DISTRIBUTIONS)}"
        )
    keys = logp[None, :] + rng.gumbel(size=(tokens, experts))
    return np.argpartition(-keys, topk - 1, axis=1)[:, :topk].astype(np.int64)

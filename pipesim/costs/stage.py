"""A stage's cost: every operation a micro-batch runs on one pipeline stage, in seconds.

A micro-batch's time on a stage is composed from the per-operation latencies of the
stage's layers (primitives.py: measured tables, else the roofline), counted per TP rank:
embedding and its all-reduce on the first stage, attention (MLA or GQA) and its
projections, the dense MLP or the MoE block (expert parallel: moe.py), the TP
all-reduces, and on the last stage the final norm, lm_head, logits all-gather and
sampling. Without a CUDA graph the CPU launches every kernel, and the stage waits for
it where that takes longer than the GPU (`launch_wait`). Stage times are cached by
what they depend on, and each use is entered in the provenance ledger (provenance.py).
"""

from __future__ import annotations

from ..inputs.box import Box
from ..inputs.model import Model
from ..inputs.plan import Plan
from ..inputs.quantization import BF16
from ..profiles.profile import Profile
from .host import HostCosts
from .moe import alltoall_ops, ep_moe_time
from .primitives import ACT_BYTES, Op, Primitives, Shape
from .provenance import Ledger, summed

# Attention cost is smooth in context: decode contexts are bucketed to this many
# tokens for the stage-time cache (relative error < 1% above ~3k tokens of context).
CONTEXT_BUCKET = 32


def bucketed(context: int) -> int:
    """A decode batch's mean context as the stage-time cache keys it (CONTEXT_BUCKET)."""
    if context > CONTEXT_BUCKET:
        return (context + CONTEXT_BUCKET // 2) // CONTEXT_BUCKET * CONTEXT_BUCKET
    return context


class CostModel(Primitives):
    """Stage, collective and hop costs for one (box, model, plan, profile)."""

    def __init__(self, box: Box, model: Model, plan: Plan, profile: Profile):
        super().__init__(box, model, plan, profile)
        self._stage_cache: dict = {}
        self.ledger = Ledger()  # provenance of every stage time the run used
        self._kinds = tuple(self._stage_kind(s) for s in range(plan.pp))
        self.host = HostCosts(profile.params, model, plan)  # the engine's host loop (host.py)

    def stage_ops(self, stage: int, shape: Shape) -> list[Op]:
        """Every operation a micro-batch of `shape` runs on `stage`, per TP rank."""
        m, tp = self.model, self.plan.tp
        gpus = self.plan.stage_gpus(stage)
        layers = self.plan.stage_layers(stage)
        n_moe = sum(1 for i in layers if m.is_moe_layer(i))
        n_dense = len(layers) - n_moe
        T = shape.tokens
        h, dt = m.hidden, m.attn_dtype
        ops: list[Op] = []

        foreign = self.foreign

        def add(name: str, result: tuple[float, str], count: int, kind: str = "compute") -> None:
            if count:
                source = "borrowed" if foreign and not result[1].startswith("roofline") else result[1]
                ops.append(Op(name, result[0], count, source, kind))

        L = len(layers)
        if stage == 0:
            add("embedding", self.elementwise(T, h, 1.0), 1)
            add(
                "embedding all-reduce",
                self.collective("all_reduce", gpus, T * h * ACT_BYTES),
                1 if tp > 1 else 0,
                "tp_comm",
            )
        # attention block
        add("norms", self.elementwise(T, h), 2 * L)
        if m.mla:
            a = m.mla
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            add("q_a+kv_a proj", self.gemm(T, a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim, h, dt), L)
            add("q_a/kv_a norms", self.elementwise(T, a.q_lora_rank + a.kv_lora_rank), L)
            add("q_b proj", self.gemm(T, m.heads // tp * qk, a.q_lora_rank, dt), L)
            add(
                "kv_b proj (absorbed)",
                self.gemm(T, m.heads // tp * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, dt),
                L,
            )
            o_in = m.heads // tp * a.v_head_dim
        else:
            add(
                "qkv proj",
                self.gemm(T, (m.heads // tp + 2 * max(m.kv_heads // tp, 1)) * m.head_dim, h, dt),
                L,
            )
            add("rope", self.elementwise(T, (m.heads // tp) * m.head_dim), L)
            o_in = m.heads // tp * m.head_dim
        add(
            "attention decode",
            self.attention_decode(shape.decode, shape.decode_ctx, tp),
            L if shape.decode else 0,
        )
        for chunk, prefix in shape.prefill:
            add("attention prefill", self.attention_prefill(chunk, prefix, tp), L)
        add("o proj", self.gemm(T, h, o_in, dt), L)
        tp_ar = self.collective("all_reduce", gpus, T * h * ACT_BYTES)
        add("attention all-reduce", tp_ar, L if tp > 1 else 0, "tp_comm")
        # MLP / MoE block
        if n_dense:
            inter = m.intermediate // tp
            add("dense mlp gate_up", self.gemm(T, 2 * inter, h, dt), n_dense)
            add("dense mlp act", self.elementwise(T, 2 * inter, 1.5), n_dense)
            add("dense mlp down", self.gemm(T, h, inter, dt), n_dense)
        if n_moe:
            mo = m.moe
            assert mo is not None  # n_moe > 0: a MoE model
            add("router gate", self.gemm(T, mo.n_routed_experts, h, BF16), n_moe)
            add("routed experts", self.moe(T, tp) if self.plan.ep == 1 else ep_moe_time(self, T), n_moe)
            if mo.n_shared_experts:
                inter = mo.n_shared_experts * mo.moe_intermediate // tp
                add("shared expert gate_up", self.gemm(T, 2 * inter, h, dt), n_moe)
                add("shared expert act", self.elementwise(T, 2 * inter, 1.5), n_moe)
                add("shared expert down", self.gemm(T, h, inter, dt), n_moe)
        if self.plan.moe_a2a == "alltoall" and n_moe:  # expert parallel's token traffic (moe.py)
            for name, result in alltoall_ops(self, T, gpus):
                add(name, result, n_moe, "tp_comm")
        add(
            "mlp all-reduce",
            tp_ar,
            (n_dense if self.plan.moe_a2a == "alltoall" else L) if tp > 1 else 0,
            "tp_comm",
        )
        if stage == self.plan.pp - 1:
            # logits only for the last token of each request (decode tokens + prefill
            # chunks that end a prompt; counting every chunk is a small overestimate)
            rows = shape.decode + len(shape.prefill)
            add("final norm", self.elementwise(T, h), 1)
            add("lm_head", self.gemm(rows, m.vocab // tp, h, m.embed_dtype), 1)
            add(
                "logits all-gather",
                self.collective("all_gather", gpus, rows * m.vocab * ACT_BYTES),
                1 if tp > 1 else 0,
                "tp_comm",
            )
            add("sampling", self.elementwise(rows, m.vocab, 2.0), 1)
        return ops

    def stage_time(self, stage: int, shape: Shape) -> tuple[float, float]:
        """(compute seconds, TP-collective seconds) of one micro-batch on one stage."""
        ctx = bucketed(shape.decode_ctx)
        key = (self._kinds[stage], shape.decode, ctx, shape.prefill, shape.graphed)
        hit = self._stage_cache.get(key)
        if hit is None:
            ops = self.stage_ops(stage, Shape(shape.decode, ctx, shape.prefill))
            compute, comm, by_source = summed(ops, self.params.kernel_scale)
            self.ledger.enter(key, by_source)
            compute += self.launch_wait(stage, compute + comm, shape)
            hit = self._stage_cache[key] = (compute, comm)
        self.ledger.use(key)
        return hit

    def provenance_shares(self) -> dict[str, float]:
        """Share of the operation time of every micro-batch computed so far, by
        provenance (the CPU launch wait of eager batches is not an operation and is
        left out); all zeros before any."""
        return self.ledger.shares()

    def launch_wait(self, stage: int, gpu_s: float, shape: Shape) -> float:
        """GPU time lost waiting for the CPU to launch kernels one by one.

        Replaying a CUDA graph launches a whole forward pass at once (but for the
        kernels an engine launches between graph pieces). Without one (eager mode,
        prefill, batches above the engine's graph sizes) the CPU issues every kernel;
        when that takes longer than the GPU needs to run them, the stage takes
        max(launch time, GPU time). Launch time: host.py `launch_s` (kernels per layer
        x launch cost per kernel, or a deployment's own eager_launch_us_per_layer)."""
        launch_s = self.host.launch_s(stage, shape.graphed, bool(shape.prefill))
        return max(0.0, launch_s - gpu_s)

    def _stage_kind(self, stage: int) -> tuple:
        """What a stage's time depends on, for the stage-time cache: its layer kinds,
        whether it embeds or samples, and what its TP collectives depend on: the ring's
        narrowest link and, across nodes, its slowest hop (two stages with equal layers
        but rings over different links, e.g. one crossing a slower link, differ)."""
        layers = self.plan.stage_layers(stage)
        n_moe = sum(1 for i in layers if self.model.is_moe_layer(i))
        gpus = self.plan.stage_gpus(stage)
        ring: tuple[float, ...] = ()
        if self.plan.tp > 1:
            ring = (
                self.ring_bw(gpus),
                self.ring_hop_latency_s(gpus) if self.box.spans_nodes(gpus) else 0.0,
                self.collectives.bandwidth_ratio(gpus),
            )
        return (len(layers) - n_moe, n_moe, stage == 0, stage == self.plan.pp - 1, ring)

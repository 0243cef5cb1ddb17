"""Costs of one lock-step data-parallel step of a MoE model (docs/engines.md §8).

With DP attention (SGLang) or vLLM's DP for a MoE model, each DP rank runs the
non-MoE part of every layer (attention, norms, dense layers, embedding, sampling) on
its own batch and its own attention group (`Plan.attn_tp` GPUs); the MoE layers then
run once for the tokens of every rank, gathered over every GPU of the stage
(`Plan.moe_width`), the experts split over all of them. A step therefore costs

    max over ranks (rank part) + MoE part(gathered tokens) + gather / scatter

The rank part is the stage's operations (costs.py `CostModel.stage_ops`) without the
MoE layers' MLP block; the MoE part is the same block of the stage costed for the
whole group (a `CostModel` of the group's plan) at the gathered token count. Each MoE
layer's tokens are all-gathered over the group before it and its output
reduce-scattered after it, every rank padded to the largest (moe.py
`dp_gather_scatter`: SGLang `MAX_LEN`, vLLM's all-gather / reduce-scatter dispatch);
with an all-to-all EP backend its dispatch and combine instead. SGLang's `SUM_LEN` mode
(a prefill in the step) gathers with all-reduces instead; pipesim costs the same pair
there (a stated approximation of a prefill step's collectives, small beside its compute).
"""

from __future__ import annotations

from dataclasses import replace

from .moe import A2A_OPS, dp_gather_scatter
from .primitives import Op, Shape
from .provenance import summed
from .stage import CostModel, bucketed

# The MLP-block operations of a MoE layer, as stage.py names them.
MOE_OPS = frozenset(
    ("router gate", "routed experts", "shared expert gate_up", "shared expert act", "shared expert down")
)
GATHER_OP = "mlp all-reduce"  # per layer: TP all-reduce of the MLP block's output
# (an all-to-all EP backend's dispatch and combine, moe.A2A_OPS, replace the gather and scatter:
# each rank dispatches its own tokens to the experts' ranks and gets their outputs back)


class DPStepCosts:
    """Rank part and MoE part of a lock-step DP step, cached like `stage_time`, each
    use counted into the cost model's provenance shares."""

    def __init__(self, costs: CostModel, dp: int):
        self.costs, self.dp = costs, dp
        plan, model = costs.plan, costs.model
        # each part alone: one rank, no DP
        alone = replace(plan, dp=1, dp_attention=False, moe_spans_dp=False)
        # one rank: its attention group (SGLang DP attention: tp / dp GPUs)
        self.rank = CostModel(costs.box, model, replace(alone, tp=plan.attn_tp, ep=1), costs.profile)
        # the MoE layers: every GPU of the stage, the experts split ep ways
        self.group = CostModel(costs.box, model, replace(alone, tp=plan.moe_width), costs.profile)
        layers = plan.stage_layers(0)
        self.n_moe = sum(1 for i in layers if model.is_moe_layer(i))
        self.n_dense = len(layers) - self.n_moe
        self._rank_cache: dict = {}
        self._moe_cache: dict = {}

    def _sum(self, key: tuple, ops: list[Op]) -> tuple[float, float]:
        """(compute, comm) of `ops`, the compute scaled by the profile's kernel_scale,
        and their provenance entered under `key` in the cost model's ledger (as
        `CostModel.stage_time` does)."""
        compute, comm, by_source = summed(ops, self.costs.params.kernel_scale)
        self.costs.ledger.enter(key, by_source)
        return compute, comm

    def rank_part(self, shape: Shape) -> tuple[float, float]:
        """(compute, comm) of one rank's batch without the MoE layers' MLP block: its
        attention TP collectives, and the MLP all-reduce of its dense layers only."""
        ctx = bucketed(shape.decode_ctx)
        key = ("dp-rank", shape.decode, ctx, shape.prefill)
        hit = self._rank_cache.get(key)
        if hit is None:
            ops = []
            for o in self.rank.stage_ops(0, Shape(shape.decode, ctx, shape.prefill)):
                if o.name in MOE_OPS:
                    continue
                if o.name == GATHER_OP:
                    if not self.n_dense:
                        continue
                    o = o._replace(count=self.n_dense)
                ops.append(o)
            hit = self._rank_cache[key] = self._sum(key, ops)
        self.costs.ledger.use(key)
        return hit

    def moe_part(self, tokens: int, largest: int) -> tuple[float, float]:
        """(compute, comm) of every MoE layer for `tokens` gathered tokens on the whole
        group, with the gather and scatter collectives of every rank padded to the
        `largest` rank's tokens (moe.py `dp_gather_scatter`), or an all-to-all EP
        backend's dispatch and combine."""
        key = ("dp-moe", tokens, largest)
        hit = self._moe_cache.get(key)
        if hit is None:
            group_ops = self.group.stage_ops(0, Shape(tokens))
            ops = [o for o in group_ops if o.name in MOE_OPS or o.name in A2A_OPS]
            if self.n_moe and not any(o.name in A2A_OPS for o in group_ops):
                for name, (seconds, source) in zip(
                    ("dp gather all-gather", "dp scatter reduce-scatter"),
                    dp_gather_scatter(self.costs, (largest,) * self.dp),
                    strict=True,
                ):
                    if self.costs.foreign and source != "roofline":
                        source = "borrowed"
                    ops.append(Op(name, seconds, self.n_moe, source, "tp_comm"))
            hit = self._moe_cache[key] = self._sum(key, ops)
        self.costs.ledger.use(key)
        return hit

    def step(
        self, shapes: list[Shape | None]
    ) -> tuple[list[tuple[float, float] | None], float, float, float]:
        """One lock-step step of every rank's batch (None: the rank runs a dummy batch).

        Returns each rank's (compute, comm) of its own part, the time the slowest
        rank's part ends (the MoE layers wait for it), the MoE part's compute and
        comm. CUDA graphs run only when every real batch is graphed (the engines take
        the minimum graph mode over the ranks); then every rank is padded to the
        largest rank's tokens (SGLang MAX_LEN, vLLM's DP padding), else the MoE layers
        see the sum. Eager launching waits are charged on the whole step."""
        real = [s for s in shapes if s is not None]
        graphed = all(s.graphed for s in real)
        parts = [self.rank_part(s) if s is not None else None for s in shapes]
        sync_s = max(c + a for c, a in (p for p in parts if p is not None))
        tokens = [s.tokens for s in real]
        gathered = self.dp * max(tokens) if graphed else sum(tokens)
        moe_c, moe_a = self.moe_part(gathered, max(tokens))
        moe_c += self.costs.launch_wait(0, sync_s + moe_c + moe_a, Shape(max(tokens), graphed=graphed))
        return parts, sync_s, moe_c, moe_a

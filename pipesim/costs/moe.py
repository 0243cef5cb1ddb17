"""Expert parallel: a MoE layer's time on its slowest EP rank, and its token traffic.

With expert parallel (`Plan.ep` > 1) each EP rank holds `ceil(E / ep)` routed experts,
each split `moe_tp` ways, and runs them over the token slots routed to it. The layer
ends when its slowest rank does (the ranks meet in the collective that combines their
outputs), so its time is the busiest rank's (docs/parallel.md §4):

- a measured table: AIConfigurator's EP rows (profile table `moe_ep`) time one rank at
  the whole batch's token count; their power-law rows put the busiest rank's experts
  on the measured GPU, so they are the slowest rank;
- else the roofline of the busiest rank: the distinct experts it touches (weights
  read) and the slots it computes (FLOPs), from the routing distribution.

Routing distributions (the profile's `moe_distribution`, the names of the tables):

- `balanced`: every expert equally likely; each rank gets T k / ep slots and touches
  E_r (1 - (1 - k / E)^T) of its E_r experts (the distinct-expert term of physics.md §2);
- `power_law_<s>`: expert popularity p_j proportional to j^-s (Zipf with exponent s;
  s = 1.01 and 1.2 are the tables' rows; inputs/routing.py parses the names, and a
  table is read between its measured exponents linearly, beyond them from the nearest
  one times this model's ratio: `routed_time`); experts sit on ranks in contiguous blocks
  (vLLM's linear placement) of an arbitrary order of popularity: the busiest rank's
  share is averaged over `PLACEMENTS` random orders (seed 0), its slots are T k x
  that share, and expert j is touched with probability 1 - (1 - min(1, k p_j))^T.

Token traffic. Dispatch and combine, per MoE layer:

- `none` (SGLang's default `--moe-a2a-backend none`, vLLM's default
  `allgather_reducescatter`; the only ones a PCIe box without NVLink runs): with
  attention TP every rank already holds every token, each EP rank computes its
  experts' share and the outputs are summed by the all-reduce over the MoE group
  that TP already pays (no dispatch); with data-parallel attention the tokens are
  all-gathered over the MoE group before the layer and reduce-scattered after it;
- `alltoall` (DeepEP / pplx style): each rank sends the hidden state of each of its
  tokens once per routed expert to the rank holding it and gets the outputs back: two
  all-to-alls whose per-rank buffer is rows x hidden x 2 bytes (rows = token-expert
  pairs of its tokens), (ep - 1) / ep of it off the GPU under uniform placement.
"""

from __future__ import annotations

from .primitives import ACT_BYTES, Primitives
from .routing import busiest_rank, routed_time

A2A_MODES = ("none", "alltoall")
A2A_OPS = ("ep dispatch all-to-all", "ep combine all-to-all")  # per MoE layer, as stage.py names them


def alltoall_offrank_bytes(rows: float, hidden: int, ep: int, act_bytes: int = ACT_BYTES) -> float:
    """Bytes one rank sends to other ranks in a dispatch (or combine) all-to-all: its
    buffer of `rows` token-expert rows x hidden x bytes, the (ep - 1) / ep of it whose
    experts live elsewhere (uniform placement)."""
    return rows * hidden * act_bytes * (ep - 1) / ep


def ep_moe_time(cm: Primitives, tokens: int) -> tuple[float, str]:
    """Routed experts of one MoE layer under expert parallel, on the slowest EP rank of
    `cm.plan` (the primitive costs, primitives.py): the measured `moe_ep` table at (moe_tp, ep), else the
    roofline of the busiest rank (module docstring)."""
    m, mo, plan, params = cm.model, cm.model.moe, cm.plan, cm.params
    assert mo is not None  # priced only for a MoE layer
    dist = params.moe_distribution
    base = (
        m.expert_dtype.kernel,
        m.hidden,
        mo.moe_intermediate,
        mo.topk,
        mo.n_routed_experts,
        plan.moe_tp,
        plan.ep,
    )

    def model_s(d: str) -> float:
        """The roofline of the busiest rank under routing `d` (module docstring)."""
        slots, distinct = busiest_rank(tokens, mo.n_routed_experts, mo.topk, plan.ep, d)
        expert = m.expert_params() / plan.moe_tp
        nbytes = distinct * expert * m.expert_dtype.bytes_per_param + ACT_BYTES * tokens * m.hidden * 2
        return cm.roofline(nbytes, 2.0 * slots * expert, m.expert_dtype.compute)

    measured = routed_time(cm.profile.tables.moe_ep_by_routing, base, dist, tokens, model_s)
    return measured if measured is not None else (model_s(dist), "roofline")


def alltoall_ops(cm: Primitives, tokens: int, gpus: tuple[int, ...]) -> list[tuple[str, tuple[float, str]]]:
    """The token traffic of one MoE layer in `alltoall` mode with attention TP: each of
    the `w` ranks of the MoE group dispatches its 1/w share of the (replicated) tokens,
    tokens k / w rows, to the experts' ranks, the outputs come back the same way, and an
    all-gather of the layer's output gives every rank all tokens again for attention.
    The all-to-all is the measured alltoall table at the per-rank buffer (rows x hidden
    x 2 bytes), else latency + off-rank bytes over the ring's narrowest link."""
    m, w = cm.model, len(gpus)
    assert m.moe is not None  # priced only for a MoE layer
    rows = tokens * m.moe.topk / w
    buf = rows * m.hidden * ACT_BYTES
    a2a = cm.collective("alltoall", gpus, buf)
    return [
        (A2A_OPS[0], a2a),
        (A2A_OPS[1], a2a),
        ("ep output all-gather", cm.collective("all_gather", gpus, tokens * m.hidden * ACT_BYTES)),
    ]


def dp_gather_scatter(
    cm: Primitives, tokens_per_rank: tuple[int, ...]
) -> tuple[tuple[float, str], tuple[float, str]]:
    """Data-parallel attention's token traffic around one MoE layer (`none` mode): the DP
    ranks' tokens all-gathered over the MoE group before it, its output reduce-scattered
    back after it. Every rank is padded to the largest rank's count (SGLang's max-length
    padding under CUDA graphs; an idle rank runs a dummy batch), so both move
    max(tokens) x dp x hidden x 2 bytes in all. Returns (gather, scatter)."""
    gpus = cm.plan.moe_gpus(0)
    nbytes = max(tokens_per_rank, default=0) * len(tokens_per_rank) * cm.model.hidden * ACT_BYTES
    return cm.collective("all_gather", gpus, nbytes), cm.collective("reduce_scatter", gpus, nbytes)

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
  s = 1.01 and 1.2 are the tables' rows); experts sit on ranks in contiguous blocks
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

from functools import lru_cache

import numpy as np

from .primitives import ACT_BYTES, Primitives

PLACEMENTS = 32  # random expert orders averaged for a skewed distribution's busiest rank

A2A_MODES = ("none", "alltoall")
A2A_OPS = ("ep dispatch all-to-all", "ep combine all-to-all")  # per MoE layer, as stage.py names them


def alltoall_offrank_bytes(rows: float, hidden: int, ep: int, act_bytes: int = ACT_BYTES) -> float:
    """Bytes one rank sends to other ranks in a dispatch (or combine) all-to-all: its
    buffer of `rows` token-expert rows x hidden x bytes, the (ep - 1) / ep of it whose
    experts live elsewhere (uniform placement)."""
    return rows * hidden * act_bytes * (ep - 1) / ep


def popularity(num_experts: int, distribution: str) -> np.ndarray:
    """Share of routed slots each expert gets (sums to 1), most popular first."""
    if distribution == "balanced":
        return np.full(num_experts, 1.0 / num_experts)
    s = power_law_exponent(distribution)
    p = np.arange(1, num_experts + 1, dtype=float) ** -s
    return p / p.sum()


def power_law_exponent(distribution: str) -> float:
    """`power_law_1.2` -> 1.2; ValueError for anything else."""
    head, _, tail = distribution.rpartition("_")
    if head != "power_law":
        raise ValueError(f"unknown routing distribution {distribution!r}")
    return float(tail)


def is_power_law(distribution: object) -> bool:
    """Whether `distribution` names a power law this module models (power_law_S, S > 0)."""
    try:
        return isinstance(distribution, str) and 0 < power_law_exponent(distribution) < 100
    except ValueError:
        return False


@lru_cache(maxsize=256)
def _busiest_share(num_experts: int, ep: int, distribution: str) -> tuple[float, tuple[float, ...]]:
    """(mean slot share of the busiest rank, its experts' popularities averaged by
    position) over PLACEMENTS random expert orders; balanced needs no sampling."""
    per_rank = -(-num_experts // ep)
    p = popularity(num_experts, distribution)
    if distribution == "balanced":
        return per_rank / num_experts, tuple(p[:per_rank])
    rng = np.random.default_rng(0)
    shares, members = [], []
    for _ in range(PLACEMENTS):
        order = p[rng.permutation(num_experts)]
        blocks = [order[r * per_rank : (r + 1) * per_rank] for r in range(ep)]
        busiest = max(blocks, key=lambda b: b.sum())
        shares.append(busiest.sum())
        members.append(np.sort(np.pad(busiest, (0, per_rank - len(busiest))))[::-1])
    return float(np.mean(shares)), tuple(np.mean(members, axis=0))


def busiest_rank(
    tokens: float, num_experts: int, topk: int, ep: int, distribution: str
) -> tuple[float, float]:
    """(token-expert slots, distinct experts touched) of the busiest EP rank for a batch
    of `tokens` tokens (the module docstring states the model)."""
    share, probs = _busiest_share(num_experts, ep, distribution)
    slots = tokens * topk * share
    if distribution == "balanced":
        per_rank = len(probs)
        distinct = per_rank * (1.0 - (1.0 - topk / num_experts) ** tokens)
    else:
        pj = np.minimum(1.0, topk * np.asarray(probs))
        distinct = float(np.sum(1.0 - (1.0 - pj) ** tokens))
    return slots, distinct


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
    for d in (dist, "balanced"):
        curve = cm.profile.moe_ep.get(base + (d,))
        if curve is not None:
            return curve(tokens) * 1e-3, curve.provenance(tokens)
    slots, distinct = busiest_rank(tokens, mo.n_routed_experts, mo.topk, plan.ep, _known(dist))
    expert = m.expert_params() / plan.moe_tp
    nbytes = distinct * expert * m.expert_dtype.bytes_per_param + ACT_BYTES * tokens * m.hidden * 2
    return cm.roofline(nbytes, 2.0 * slots * expert, m.expert_dtype.compute), "roofline"


def _known(distribution: str) -> str:
    """The distribution itself when this module can model it, else balanced."""
    if distribution == "balanced":
        return distribution
    try:
        power_law_exponent(distribution)
    except ValueError:
        return "balanced"
    return distribution


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

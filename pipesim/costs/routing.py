"""Routing skew: how a MoE layer's token slots fall on its experts and EP ranks, and a
measured MoE table read at any routing distribution (inputs/routing.py names them).

- `popularity`: expert j's share of the slots, p_j proportional to j^-s (balanced: s = 0);
- `busiest_rank`: the slots and distinct experts of the busiest EP rank (moe.py's model:
  contiguous blocks of experts per rank in random popularity order, `PLACEMENTS` of them
  averaged; one rank, ep = 1, holds every expert);
- `routed_time`: a table's curves of one shape by measured exponent, read at a
  distribution: measured exponents as measured, between two linearly in the exponent,
  beyond them the nearest times the roofline's ratio (never another distribution's
  curve in its place).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from ..inputs.routing import exponent, name_of
from ..profiles.curves import weakest
from .collectives import SCALED

PLACEMENTS = 32  # random expert orders averaged for a skewed distribution's busiest rank


def popularity(num_experts: int, distribution: str) -> np.ndarray:
    """Share of routed slots each expert gets (sums to 1), most popular first."""
    s = exponent(distribution)
    if s == 0:
        return np.full(num_experts, 1.0 / num_experts)
    p = np.arange(1, num_experts + 1, dtype=float) ** -s
    return p / p.sum()


def routed_time(
    by_routing: dict, base: tuple, distribution: str, tokens: int, model_s: Callable[[str], float]
) -> tuple[float, str] | None:
    """A routed-expert layer's (seconds, provenance) from a measured MoE table (its curves
    of shape `base` by routing exponent, tables.Tables.moe_by_routing), at `distribution`:
    a measured exponent as measured; between two, linear in the exponent (interpolated);
    beyond them, the nearest one times the roofline's ratio between the two (`model_s`:
    the roofline's seconds at a distribution; scaled). None: no table of this shape."""
    curves = by_routing.get(base)
    if not curves:
        return None
    s = exponent(distribution)
    if s in curves:
        return curves[s](tokens) * 1e-3, curves[s].provenance(tokens)
    below, above = [x for x in curves if x < s], [x for x in curves if x > s]
    if below and above:
        a, b = max(below), min(above)
        w = (s - a) / (b - a)
        ms = (1.0 - w) * curves[a](tokens) + w * curves[b](tokens)
        return ms * 1e-3, weakest("interpolated", curves[a].provenance(tokens), curves[b].provenance(tokens))
    near = max(below) if below else min(above)
    ratio = model_s(distribution) / model_s(name_of(near))
    return curves[near](tokens) * 1e-3 * ratio, SCALED


@lru_cache(maxsize=256)
def _busiest_share(num_experts: int, ep: int, distribution: str) -> tuple[float, tuple[float, ...]]:
    """(mean slot share of the busiest rank, its experts' popularities averaged by
    position) over PLACEMENTS random expert orders; balanced needs no sampling."""
    per_rank = -(-num_experts // ep)
    p = popularity(num_experts, distribution)
    if exponent(distribution) == 0:
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
    if exponent(distribution) == 0:
        per_rank = len(probs)
        distinct = per_rank * (1.0 - (1.0 - topk / num_experts) ** tokens)
    else:
        pj = np.minimum(1.0, topk * np.asarray(probs))
        distinct = float(np.sum(1.0 - (1.0 - pj) ** tokens))
    return slots, distinct

"""GPU memory: weights per GPU, and the KV cache left for requests.

Engines size the KV pool as `memory x fraction - weights` on every GPU and take the
smallest pool over the ranks (the stage with the most layers, or the last stage with
the lm_head, usually binds).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UserError
from .hardware import Box
from .model import Model
from .plan import Plan


@dataclass(frozen=True)
class Memory:
    weights_per_gpu_bytes: tuple[float, ...]  # per stage (each TP rank of a stage alike)
    usable_per_gpu_bytes: float  # memory x engine fraction
    kv_tokens: int  # tokens the KV pool holds (min over stages)
    kv_bytes_per_token: tuple[float, ...]  # per stage, per GPU


def stage_weight_bytes(model: Model, plan: Plan, stage: int) -> float:
    """Weights one GPU of `stage` holds: its layers split over TP, plus the embedding
    (first stage) and lm_head (last stage), vocab-parallel over TP."""
    layers = sum(model.layer_weight_bytes(i) for i in plan.stage_layers(stage))
    extra = (model.embedding_bytes() if stage == 0 else 0.0) + (
        model.embedding_bytes() if stage == plan.pp - 1 else 0.0
    )
    return (layers + extra) / plan.tp


def plan_memory(box: Box, model: Model, plan: Plan, fraction: float, engine: str) -> Memory:
    usable = box.gpu.memory_bytes * fraction
    weights = tuple(stage_weight_bytes(model, plan, s) for s in range(plan.pp))
    per_token = tuple(
        model.kv_bytes_per_token_per_layer(plan.tp) * len(plan.stage_layers(s)) for s in range(plan.pp)
    )
    worst = max(range(plan.pp), key=lambda s: weights[s])
    if weights[worst] >= usable:
        gib = 2**30
        raise UserError(
            f"{model.name} does not fit at tp={plan.tp} pp={plan.pp}: stage {worst} needs "
            f"{weights[worst] / gib:.1f} GiB of weights per GPU, but {engine} may use "
            f"{usable / gib:.1f} GiB of the {box.gpu.memory_bytes / gib:.1f} GiB on each {box.gpu.name} "
            f"(fraction {fraction}); use more GPUs (larger tp x pp)"
        )
    kv_tokens = min(int((usable - weights[s]) // per_token[s]) for s in range(plan.pp))
    return Memory(weights, usable, kv_tokens, per_token)

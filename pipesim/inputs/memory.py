"""GPU memory: weights per GPU, and the KV cache left for requests.

Engines size the KV pool as `memory x fraction - weights` on every GPU and take the
smallest pool over the ranks (the stage with the most layers, or the last stage with
the lm_head, usually binds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import UserError
from .box import Box
from .model import Model
from .plan import Plan


@dataclass(frozen=True)
class Memory:
    weights_per_gpu_bytes: tuple[float, ...]  # per stage (each TP rank of a stage alike)
    usable_per_gpu_bytes: float  # memory x engine fraction
    kv_tokens: int  # tokens the KV pool holds (min over stages), per DP rank
    kv_bytes_per_token: tuple[float, ...]  # per stage, per GPU


def stage_weight_bytes(model: Model, plan: Plan, stage: int) -> float:
    """Weights one GPU of `stage` holds: its layers split over TP, plus the embedding
    (first stage) and lm_head (last stage), vocab-parallel over TP. A tied lm_head is the
    embedding itself on a single stage; under PP the last stage holds its own copy (vLLM's
    Llama-family models build `embed_tokens` on the last rank too when
    `tie_word_embeddings`, to tie the lm_head to).

    With expert or data parallel (docs/parallel.md §3) the routed experts are split
    over the MoE group: the fullest EP rank's `experts_per_rank` experts, each split
    `moe_tp` ways. The rest follows the engine: vLLM splits it over each DP rank's `tp`
    GPUs; SGLang's DP attention splits attention over the attention group (`attn_tp`),
    keeps the embedding whole on every GPU, and splits the lm_head, shared experts,
    router and dense MLP layers over all `tp` GPUs of the stage."""
    layers = sum(model.layer_weight_bytes(i) for i in plan.stage_layers(stage))
    embed = model.embedding_bytes() if stage == 0 else 0.0
    shared = model.tied_embeddings and plan.pp == 1
    head = model.embedding_bytes() if stage == plan.pp - 1 and not shared else 0.0
    if plan.dp == 1 and plan.ep == 1:
        return (layers + embed + head) / plan.tp
    routed = sum(model.routed_expert_bytes(i) for i in plan.stage_layers(stage))
    per_rank = (
        plan.experts_per_rank(model.moe.n_routed_experts) / model.moe.n_routed_experts if routed else 0.0
    )
    experts = routed * per_rank / plan.moe_tp
    if not plan.dp_attention:
        return (layers - routed + embed + head) / plan.attn_tp + experts
    attn = len(plan.stage_layers(stage)) * model.attention_params() * model.attn_dtype.bytes_per_param
    return attn / plan.attn_tp + embed + (layers - routed - attn + head) / plan.tp + experts


def plan_memory(box: Box, model: Model, plan: Plan, fraction: float, engine: str) -> Memory:
    usable = box.gpu.memory_bytes * fraction
    weights = tuple(stage_weight_bytes(model, plan, s) for s in range(plan.pp))
    per_token = tuple(
        model.kv_bytes_per_token_per_layer(plan.attn_tp) * len(plan.stage_layers(s)) for s in range(plan.pp)
    )
    worst = max(range(plan.pp), key=lambda s: weights[s])
    if weights[worst] >= usable:
        gib = 2**30
        raise UserError(
            f"{model.name} does not fit at {_split(plan)}: stage {worst} needs "
            f"{weights[worst] / gib:.1f} GiB of weights per GPU, but {engine} may use "
            f"{usable / gib:.1f} GiB of the {box.gpu.memory_bytes / gib:.1f} GiB on each {box.gpu.name} "
            f"(fraction {fraction}); use more GPUs (larger tp x pp{', or ep' if plan.ep > 1 or plan.dp > 1 else ''})"
        )
    kv_tokens = min(int((usable - weights[s]) // per_token[s]) for s in range(plan.pp))
    return Memory(weights, usable, kv_tokens, per_token)


def _split(plan: Plan) -> str:
    extra = (f" dp={plan.dp}" if plan.dp > 1 else "") + (f" ep={plan.ep}" if plan.ep > 1 else "")
    return f"tp={plan.tp} pp={plan.pp}{extra}"

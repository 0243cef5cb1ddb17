"""GPU memory: weights per GPU, and the KV cache left for requests.

Each engine sizes its KV pool on every GPU as a budget (the GPU's memory times its
fraction) less the weights and what else it holds back, by its own rule and version
(engines/reserve.py, docs/engines.md §9): SGLang the part of the CUDA context and
communicators its fraction covers, vLLM its profiling run's activation peak, non-torch
memory and, from 0.21, CUDA graphs. The pool is the smallest over the stages (the stage
with the most layers, or the last with the lm_head and sampler, usually binds).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import UserError, require
from .box import Box
from .model import Model
from .plan import Plan

GiB = 2**30


@dataclass(frozen=True)
class MemoryRule:
    """An engine's KV sizing for one plan: its budget per GPU, what it holds back on each
    stage besides the weights, a cap on the pool's tokens, and its own refusal to start."""

    engine: str  # the engine's title, for messages (SGLang, vLLM)
    rule: str  # the rule in words, with its source
    fraction: float  # the engine's memory share (--mem-fraction-static / --gpu-memory-utilization)
    fraction_flag: str
    budget_bytes: float  # GPU memory x fraction
    held: tuple[tuple[tuple[str, float], ...], ...]  # per stage: (what, bytes), besides the weights
    token_cap: int | None = None  # SGLang --max-total-tokens
    refusal: str = ""  # one line: why the engine would not start at all


@dataclass(frozen=True)
class Memory:
    weights_per_gpu_bytes: tuple[float, ...]  # per stage (each TP rank of a stage alike)
    usable_per_gpu_bytes: float  # memory x engine fraction
    kv_tokens: int  # tokens the KV pool holds (min over stages, capped), per DP rank
    kv_bytes_per_token: tuple[float, ...]  # per stage, per GPU
    rule: MemoryRule | None = None  # how the engine sized it
    kv_bytes: tuple[float, ...] = ()  # per stage: the budget less weights and what is held
    stage: int = 0  # the stage whose pool binds

    def describe(self, gpu_memory_bytes: float) -> dict:
        """The reservation's parts on the binding stage's GPUs (the scenario description's
        `kv_reservation`), in GiB."""
        r, s = self.rule, self.stage
        if r is None:
            return {}
        gib = lambda b: round(b / GiB, 3)  # noqa: E731
        return {
            "engine": r.engine,
            "rule": r.rule,
            "stage": s,
            "gpu_memory_gib": gib(gpu_memory_bytes),
            "fraction": r.fraction,
            "budget_gib": gib(r.budget_bytes),
            "weights_gib": gib(self.weights_per_gpu_bytes[s]),
            "held_gib": {what: gib(b) for what, b in r.held[s]},
            "kv_gib": gib(self.kv_bytes[s]),
            "kv_tokens": self.kv_tokens,
            **({"max_total_tokens": r.token_cap} if r.token_cap is not None else {}),
        }


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
    moe = model.moe  # routed bytes only where there are experts
    per_rank = plan.experts_per_rank(moe.n_routed_experts) / moe.n_routed_experts if routed and moe else 0.0
    experts = routed * per_rank / plan.moe_tp
    if not plan.dp_attention:
        return (layers - routed + embed + head) / plan.attn_tp + experts
    attn = len(plan.stage_layers(stage)) * model.attention_params() * model.attn_dtype.bytes_per_param
    return attn / plan.attn_tp + embed + (layers - routed - attn + head) / plan.tp + experts


def plan_memory(box: Box, model: Model, plan: Plan, rule: MemoryRule) -> Memory:
    """The KV pool `rule` leaves on every GPU: one UserError line when the engine would
    refuse to start, when the weights alone exceed its budget, or when nothing is left."""
    require(not rule.refusal, rule.refusal)
    weights = tuple(stage_weight_bytes(model, plan, s) for s in range(plan.pp))
    per_token = tuple(
        model.kv_bytes_per_token_per_layer(plan.attn_tp) * len(plan.stage_layers(s)) for s in range(plan.pp)
    )
    budget = rule.budget_bytes
    on_gpu = f"{budget / GiB:.1f} GiB of the {box.gpu.memory_bytes / GiB:.1f} GiB on each {box.gpu.name}"
    more = f"use more GPUs (larger tp x pp{', or ep' if plan.ep > 1 or plan.dp > 1 else ''})"
    worst = max(range(plan.pp), key=lambda s: weights[s])
    if weights[worst] >= budget:
        raise UserError(
            f"{model.name} does not fit at {_split(plan)}: stage {worst} needs "
            f"{weights[worst] / GiB:.1f} GiB of weights per GPU, but {rule.engine.lower()} may use "
            f"{on_gpu} (fraction {rule.fraction}); {more}"
        )
    kv = tuple(budget - weights[s] - sum(b for _, b in rule.held[s]) for s in range(plan.pp))
    tokens = [int(kv[s] // per_token[s]) if kv[s] > 0 else 0 for s in range(plan.pp)]
    stage = min(range(plan.pp), key=lambda s: tokens[s])
    if tokens[stage] <= 0:
        held = ", ".join(f"{what} {b / GiB:.2f}" for what, b in rule.held[stage])
        raise UserError(
            f"{model.name} leaves no KV cache at {_split(plan)}: on stage {stage} the weights "
            f"({weights[stage] / GiB:.1f} GiB) and what {rule.engine} holds back ({held} GiB) take all "
            f"{on_gpu} ({rule.fraction_flag} {rule.fraction}), and {rule.engine} would refuse to start; "
            f"{more} or raise {rule.fraction_flag}"
        )
    kv_tokens = tokens[stage] if rule.token_cap is None else min(tokens[stage], rule.token_cap)
    return Memory(weights, budget, kv_tokens, per_token, rule, kv, stage)


def _split(plan: Plan) -> str:
    extra = (f" dp={plan.dp}" if plan.dp > 1 else "") + (f" ep={plan.ep}" if plan.ep > 1 else "")
    return f"tp={plan.tp} pp={plan.pp}{extra}"

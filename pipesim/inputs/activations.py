"""The transient GPU memory of one forward pass, from the model's shapes.

An engine that sizes its KV cache by profiling (vLLM's `profile_run`, docs/engines.md §9)
runs a dummy forward over N tokens and takes the allocator's peak: besides the weights,
the tensors alive at once at the forward's widest point. Counted here per GPU of a stage,
in the 16-bit activation dtype (2 bytes), per token:

- the residual stream carried from layer to layer: hidden states and residual, 2 h;
- the attention block at its widest. GQA: q, k, v ((H + 2 K) d / t, a KV head replicated
  when there are fewer than t), the attention output (H d / t) and o_proj's output (h).
  MLA, on the prefill path that expands the latent: the query ([q_lora +] H (dn + dr) / t),
  the latent and rope key (r + dr), kv_b's keys and values (H (dn + dv) / t), the full
  keys (H (dn + dr) / t), the attention output (H dv / t) and o_proj's output (h);
- a dense MLP: its normalized input (h), gate_up's output (2 I / t) and the activated
  product (I / t);
- an MoE layer: its input (h), the router's logits (E), the shared experts' output held
  while the routed ones run (h), and the fused-experts kernel's three buffers per routed
  slot (2 I_e / t_moe, I_e / t_moe and h: vllm/model_executor/layers/fused_moe
  `fused_experts_impl`, intermediate_cache1-3), sized for at most 16384 tokens a chunk
  (VLLM_FUSED_MOE_CHUNK_SIZE, vllm/envs.py). With vLLM's data parallel on an MoE model
  the layer sees every DP rank's tokens (its default dispatch all-gathers them).
The forward's peak is the residual stream plus the widest block of the stage's layers;
a dense layer's block is counted unfused (torch.compile may free the normalized input
earlier: an upper bound by h per token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Model
    from .plan import Plan

ACT_BYTES = 2  # activations in the model's 16-bit dtype (bf16 / fp16)
MOE_CHUNK_TOKENS = 16 * 1024  # VLLM_FUSED_MOE_CHUNK_SIZE default (vllm/envs.py)


def attention_width(model: Model, tp: int) -> int:
    """Elements per token the attention block holds at once on one of `tp` GPUs."""
    h, heads = model.hidden, model.heads // tp
    if model.mla:
        a = model.mla
        query = a.q_lora_rank + heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        latent = a.kv_lora_rank + a.qk_rope_head_dim
        keys_values = heads * (a.qk_nope_head_dim + a.v_head_dim)
        keys = heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
        return query + latent + keys_values + keys + heads * a.v_head_dim + h
    kv = max(model.kv_heads // tp, 1)
    return (heads + 2 * kv) * model.head_dim + heads * model.head_dim + h


def dense_mlp_width(model: Model, tp: int) -> int:
    """Elements per token a dense MLP holds at once: input, gate_up, activated product."""
    return model.hidden + 3 * model.intermediate // tp


def moe_bytes(model: Model, plan: Plan, tokens: int) -> float:
    """Bytes an MoE layer holds at once on one GPU for a forward over `tokens`."""
    m, h = model.moe, model.hidden
    assert m is not None  # called for MoE layers only
    gathered = tokens * (plan.dp if plan.moe_spans_dp else 1)
    chunk = min(gathered, MOE_CHUNK_TOKENS)
    per_slot = 3 * m.moe_intermediate // plan.moe_tp + h  # cache1 (gate_up), cache2, cache3
    shared = h if m.n_shared_experts else 0
    return ACT_BYTES * (gathered * (h + m.n_routed_experts + shared) + chunk * m.topk * per_slot)


def forward_peak_bytes(model: Model, plan: Plan, stage: int, tokens: int) -> float:
    """The most bytes a forward over `tokens` holds at once on one GPU of `stage`
    (the module docstring's count): the residual stream plus the widest block."""
    layers = plan.stage_layers(stage)
    widest: float = ACT_BYTES * tokens * attention_width(model, plan.attn_tp)
    if any(not model.is_moe_layer(i) for i in layers):
        widest = max(widest, ACT_BYTES * tokens * dense_mlp_width(model, plan.tp))
    if any(model.is_moe_layer(i) for i in layers):
        widest = max(widest, moe_bytes(model, plan, tokens))
    return ACT_BYTES * tokens * 2 * model.hidden + widest

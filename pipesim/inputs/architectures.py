"""Which Hugging Face architectures pipesim models, and how each names its sizes.

An architecture is accepted only where `model.Model` can say its shapes truthfully:
a decoder of GQA or MLA attention with a gated MLP of three projections (gate, up,
down) or routed experts of the same form. Each family's config spells a few things its
own way; the readers below turn them into the fields `model.from_hf_config` builds from.

Modelled, each with its config classes' defaults (transformers' `*Config`):
- Llama, Mistral (and Mistral Nemo / Small), Qwen2, Qwen3, Phi-3 / Phi-4 (`Phi3ForCausalLM`:
  its fused qkv_proj and gate_up_proj hold the Llama shapes): dense GQA;
- Gemma 2 (`Gemma2ForCausalLM`): dense GQA with `head_dim` apart from hidden / heads and
  the embedding tied to the lm_head (`Gemma2Config.tie_word_embeddings` defaults to true);
  its local layers' 4096-token window is priced and cached as full attention (exact below
  4096 tokens of context, an upper bound above);
- Mixtral (`num_local_experts`, every layer MoE, the expert's size in `intermediate_size`),
  OLMoE (`num_experts`, the expert's size in `intermediate_size`), Qwen3-MoE, Qwen2-MoE
  (one shared expert of `shared_expert_intermediate_size`: the engines run it as one MLP
  of that size, priced as `shared_expert_intermediate_size / moe_intermediate_size` fused
  experts, as DeepSeek's `n_shared_experts` are), GLM-4.5/4.6, gpt-oss: GQA + MoE;
- DeepSeek-V2 (and V2-Lite), V3, Kimi K2: MLA + MoE.

Left out: `PhiForCausalLM` (phi-2: a two-projection GELU MLP in parallel with attention),
Gemma 3 (five of six layers attend within 1024 tokens, which binds at common lengths, and
its multimodal checkpoints carry a vision tower), Qwen2-MoE / Qwen3-MoE configs whose MoE
layers are not every layer (`decoder_sparse_step` > 1 or `mlp_only_layers`: refused).
"""

from __future__ import annotations

from ..base.errors import require

ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Phi3ForCausalLM",
    "Gemma2ForCausalLM",
    "OlmoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Glm4MoeForCausalLM",
    "GptOssForCausalLM",
)
MODEL_TYPES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "phi3",
    "gemma2",
    "olmoe",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "glm4_moe",
    "gpt_oss",
)
# model types whose config class ties the embedding to the lm_head unless told otherwise
TIED_BY_DEFAULT = ("gemma2",)


def tied_embeddings(cfg: dict) -> bool:
    """Whether the lm_head is the embedding (`tie_word_embeddings`, else the config
    class's default): the weights hold it once (memory.stage_weight_bytes)."""
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        return cfg.get("model_type") in TIED_BY_DEFAULT
    require(isinstance(tied, bool), f"'tie_word_embeddings' must be true or false, got {tied!r}")
    return tied


def check_moe_layers(cfg: dict, name: str) -> None:
    """Qwen2/3-MoE name their dense layers by `decoder_sparse_step` and `mlp_only_layers`;
    pipesim's MoE layers are every layer after `first_k_dense_replace`, so only the
    every-layer form (step 1, no MLP-only layer) is accepted."""
    step = cfg.get("decoder_sparse_step")
    only = cfg.get("mlp_only_layers")
    require(
        step in (None, 1) and not only,
        f"model config {name}: decoder_sparse_step = {step!r}, mlp_only_layers = {only!r}: MoE on only some "
        "layers is not modelled; allowed: decoder_sparse_step 1 and no mlp_only_layers",
    )


def shared_experts(cfg: dict, moe_intermediate: int, name: str) -> int | None:
    """Qwen2-MoE's one shared expert of `shared_expert_intermediate_size`, as the number
    of fused experts of the routed size it equals (None: the config has none of its own)."""
    size = cfg.get("shared_expert_intermediate_size")
    if not size:
        return None
    require(
        isinstance(size, int) and size % moe_intermediate == 0,
        f"model config {name}: shared_expert_intermediate_size = {size!r} is not a whole multiple of "
        f"moe_intermediate_size = {moe_intermediate}",
    )
    return size // moe_intermediate

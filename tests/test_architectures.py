"""The architectures pipesim models (architectures.py): each preset's parameter count
against its model card, worked from the card's own figures, and what is refused."""

import json
from importlib import resources

import pytest

from pipesim.base.errors import UserError
from pipesim.inputs.memory import stage_weight_bytes
from pipesim.inputs.model import from_hf_config, load_model
from pipesim.inputs.plan import make_plan


# Totals and active parameters as the model cards state them (billions), and the tolerance:
# - Mixtral-8x7B (Mistral AI, "Mixtral of experts", 2023-12-11 and arXiv 2401.04088): 46.7B
#   total, 12.9B used per token;
# - Mixtral-8x22B (Mistral AI, "Cheaper, Better, Faster, Stronger", 2024-04-17): 141B total,
#   39B active;
# - Qwen2-57B-A14B (its model card): 57B total, 14B activated (both rounded: 3%);
# - OLMoE-1B-7B (its model card and arXiv 2409.02060): 6.9B total, 1.3B active;
# - DeepSeek-V2-Lite (its model card's table): 15.7B total, 2.4B activated;
# - Phi-4 (its model card): 14B (rounded; Hugging Face lists 14.7B: 5%);
# - Gemma 2 (Gemma 2 technical report, arXiv 2408.00118, Table 2): 9B = 8.32B non-embedding
#   + 0.92B embedding, 27B = 26.05B + 1.18B (the embedding counted once: it is tied);
# - Mistral-Small-24B-Instruct-2501 (its model card): 24B (rounded: 3%).
# Counted here: every projection and expert, the router, the embedding and the lm_head;
# norms and biases are not (under 0.01% of each).
def _preset(name: str) -> dict:
    return json.loads(resources.files("pipesim.data").joinpath("models", f"{name}.json").read_text())


CARDS = [
    ("mixtral-8x7b", 46.7, 12.9, 0.01),
    ("mixtral-8x22b", 141, 39, 0.01),
    ("qwen2-57b-a14b", 57, 14, 0.03),
    ("olmoe-1b-7b", 6.9, 1.3, 0.02),
    ("phi-4", 14, None, 0.05),
    ("gemma-2-9b", 8.32 + 0.92, None, 0.002),
    ("gemma-2-27b", 26.05 + 1.18, None, 0.002),
    ("mistral-small-24b", 24, None, 0.03),
]


@pytest.mark.parametrize("name, total, active, tol", CARDS)
def test_parameter_counts_match_the_model_cards(name, total, active, tol):
    m = load_model(name)
    assert m.params() / 1e9 == pytest.approx(total, rel=tol)
    if active is not None:
        assert m.params(active=True) / 1e9 == pytest.approx(active, rel=tol)


def test_deepseek_v2_lite_counts_like_its_card():
    # 15.7B total; its 2.4B activated leave out the input embedding (a lookup, no compute):
    # counted here 2.66B with both embeddings, 2.45B without the input one
    m = load_model("deepseek-v2-lite")
    assert m.mla.q_lora_rank == 0  # no query LoRA: q is one projection
    assert m.params() / 1e9 == pytest.approx(15.7, rel=0.01)
    assert (m.params(active=True) - m.vocab * m.hidden) / 1e9 == pytest.approx(2.4, rel=0.03)


def test_mixtral_by_hand():
    # one layer: attention q 4096x4096, k and v 4096x1024, o 4096x4096; 8 experts of
    # 3 x 4096 x 14336; the router 4096 x 8; embedding and lm_head 32000 x 4096 each
    m = load_model("mixtral-8x7b")
    attn = 4096 * 4096 * 2 + 4096 * 1024 * 2
    layer = attn + 8 * 3 * 4096 * 14336 + 4096 * 8
    assert m.params() == 32 * layer + 2 * 32000 * 4096
    assert m.params(active=True) == 32 * (attn + 2 * 3 * 4096 * 14336 + 4096 * 8) + 2 * 32000 * 4096
    assert all(m.is_moe_layer(i) for i in range(32)) and m.moe.n_shared_experts == 0


def test_qwen2_moe_shared_expert_is_one_mlp_of_its_size():
    # Qwen2-57B-A14B: the shared expert's 20480 = 8 experts of 2560, so its weights and its
    # GEMM (n_shared x moe_intermediate) are those of one MLP of 20480
    m = load_model("qwen2-57b-a14b")
    assert m.moe.n_shared_experts * m.moe.moe_intermediate == 20480


def test_qwen1_5_moe_a2_7b_from_its_config():
    # Qwen/Qwen1.5-MoE-A2.7B config.json (public): card 14.3B total, 2.7B activated
    cfg = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "num_hidden_layers": 24,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    }
    m = from_hf_config(cfg)
    assert m.moe.n_shared_experts == 4
    assert m.params() / 1e9 == pytest.approx(14.3, rel=0.01)
    assert m.params(active=True) / 1e9 == pytest.approx(2.7, rel=0.01)


def test_gemma2_ties_its_embedding_by_default():
    # Gemma2Config.tie_word_embeddings defaults to true: one 256000 x 4608 matrix, held once
    # at a single stage; the last PP stage holds its own copy for the lm_head
    m = load_model("gemma-2-27b")
    assert m.tied_embeddings
    embed = 256000 * 4608 * 2
    assert m.total_weight_bytes() == pytest.approx(sum(m.layer_weight_bytes(i) for i in range(46)) + embed)
    one = make_plan(1, 1, 46, 8, "vllm")
    two = make_plan(1, 2, 46, 8, "vllm")
    assert stage_weight_bytes(m, one, 0) == pytest.approx(m.total_weight_bytes())
    layers1 = sum(m.layer_weight_bytes(i) for i in range(23, 46))
    assert stage_weight_bytes(m, two, 1) == pytest.approx(layers1 + embed)


def test_an_untied_config_of_a_tied_family_is_untied():
    cfg = _preset("gemma-2-9b")
    assert not from_hf_config({**cfg, "tie_word_embeddings": False}).tied_embeddings


@pytest.mark.parametrize(
    "change, says",
    [
        ({"decoder_sparse_step": 2}, "MoE on only some layers is not modelled"),
        ({"mlp_only_layers": [0, 1]}, "MoE on only some layers is not modelled"),
        ({"shared_expert_intermediate_size": 3000}, "not a whole multiple of moe_intermediate_size = 2560"),
    ],
)
def test_moe_forms_not_modelled_are_refused(change, says):
    cfg = _preset("qwen2-57b-a14b")
    with pytest.raises(UserError, match=says):
        from_hf_config({**cfg, **change})


@pytest.mark.parametrize("arch", ["PhiForCausalLM", "Gemma3ForCausalLM"])
def test_architectures_left_out_are_refused(arch):
    with pytest.raises(UserError, match=f"architecture {arch} is not modelled"):
        from_hf_config({"architectures": [arch], "hidden_size": 64, "num_attention_heads": 4})

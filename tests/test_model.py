"""Model architecture: sizes counted from the config, checked against physics.md §2."""

import json
from importlib import resources

import pytest

from pipesim.base.errors import UserError
from pipesim.inputs.model import from_hf_config, load_model, preset_names
from pipesim.inputs.quantization import BYTES_PER_PARAM

INT4_BYTES = 4.5 / 8  # int4 + one bf16 scale per group of 32 (physics.md §2)


def test_presets_listed():
    assert {"kimi-k2.6", "deepseek-v3", "llama-3.1-70b", "llama-3.1-8b"} <= set(preset_names())


def test_kimi_structure(kimi):
    # physics.md §2: 61 layers, layer 0 dense, layers 1-60 MoE; MLA; 384 experts top-8
    assert kimi.num_layers == 61 and kimi.hidden == 7168 and kimi.heads == 64
    assert kimi.family == "mla"
    assert not kimi.is_moe_layer(0)
    assert all(kimi.is_moe_layer(i) for i in range(1, 61))
    assert kimi.moe.n_routed_experts == 384 and kimi.moe.topk == 8 and kimi.moe.n_shared_experts == 1
    # routed experts INT4, attention / shared expert / embeddings bf16
    assert kimi.expert_dtype.kernel == "int4" and kimi.expert_dtype.group == 32
    assert kimi.attn_dtype.kernel == "bf16" and kimi.embed_dtype.kernel == "bf16"


def test_int4_is_4_5_bits():
    assert BYTES_PER_PARAM["int4"] == pytest.approx(INT4_BYTES)
    assert BYTES_PER_PARAM["bf16"] == 2.0


def test_kimi_total_about_594_gb(kimi):
    # physics.md §2: "Total ~594 GB (derived)"
    assert kimi.total_weight_bytes() / 1e9 == pytest.approx(594, rel=0.005)


def test_kimi_routed_experts_per_layer(kimi):
    # physics.md §2: 384 x 3 x 7168 x 2048 params = 9.5 GB in INT4, 24.8 MB per expert
    per_expert = 3 * 7168 * 2048
    assert kimi.expert_params() == per_expert
    assert kimi.moe.n_routed_experts * kimi.expert_params() == 384 * 3 * 7168 * 2048
    assert per_expert * INT4_BYTES / 1e6 == pytest.approx(24.8, abs=0.05)
    assert kimi.expert_params() * kimi.expert_dtype.bytes_per_param / 1e6 == pytest.approx(24.8, abs=0.05)
    routed = 384 * per_expert * INT4_BYTES
    assert routed / 1e9 == pytest.approx(9.5, abs=0.05)


def test_kimi_moe_layer_bytes(kimi):
    # physics.md §2 per MoE layer: routed 9.5 GB + attention ~101 M params bf16 (0.20 GB)
    # + shared expert 44 M (0.09 GB) + a small router (hidden x experts)
    assert kimi.attention_params() / 1e6 == pytest.approx(101, rel=0.01)
    expected = (
        384 * 3 * 7168 * 2048 * INT4_BYTES
        + kimi.attention_params() * 2
        + 3 * 7168 * 2048 * 2
        + 7168 * 384 * 2
    )
    assert kimi.layer_weight_bytes(1) == pytest.approx(expected, rel=1e-9)
    assert kimi.layer_weight_bytes(1) / 1e9 == pytest.approx(9.5 + 0.20 + 0.09, abs=0.05)


def test_kimi_dense_layer_bytes(kimi):
    # layer 0: attention + a dense SwiGLU MLP of intermediate 18432, all bf16
    expected = kimi.attention_params() * 2 + 3 * 7168 * 18432 * 2
    assert kimi.layer_weight_bytes(0) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_mla_kv_is_replicated(kimi, tp):
    # physics.md §2: 576 elements per token per layer, 1152 B in bf16, replicated on every TP rank
    assert kimi.mla.kv_lora_rank + kimi.mla.qk_rope_head_dim == 576
    assert kimi.kv_bytes_per_token_per_layer(tp) == 1152


@pytest.mark.parametrize(
    "tp,expected", [(1, 2 * 8 * 128 * 2), (2, 2 * 4 * 128 * 2), (4, 2 * 2 * 128 * 2), (8, 2 * 1 * 128 * 2)]
)
def test_gqa_kv_split_over_tp(llama8, tp, expected):
    # Llama-3.1-8B: 8 KV heads of dim 128, K and V, bf16; split over TP ranks
    assert llama8.kv_bytes_per_token_per_layer(tp) == expected


def test_gqa_kv_head_replicated_beyond_kv_heads(tiny_config):
    # 4 KV heads on 8 ranks: each rank still holds one whole head (replicated)
    m = load_model(tiny_config())
    assert m.kv_bytes_per_token_per_layer(8) == 2 * 1 * 64 * 2


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_check_tp_accepts_divisors(kimi, llama8, tp):
    kimi.check_tp(tp)
    llama8.check_tp(tp)


@pytest.mark.parametrize("tp", [3, 5, 6, 7])
def test_check_tp_rejects_non_divisors(kimi, tp):
    with pytest.raises(UserError) as exc:
        kimi.check_tp(tp)
    assert "64" in str(exc.value)  # names the head count it must divide


def test_check_tp_rejects_bad_kv_split(tiny_config):
    # 12 heads, 3 KV heads: tp 2 divides the heads but neither 2 | 3 nor 3 | 2
    m = load_model(tiny_config(num_attention_heads=12, num_key_value_heads=3, intermediate_size=4098))
    with pytest.raises(UserError) as exc:
        m.check_tp(2)
    assert "KV" in str(exc.value)


def test_load_hf_config_from_path(tiny_config):
    path = tiny_config()
    m = load_model(path)
    assert (m.num_layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (4, 1024, 16, 4, 64)
    assert (m.intermediate, m.vocab, m.max_context) == (4096, 32000, 8192)
    assert m.mla is None and m.moe is None and m.family == "gqa"
    # the folder holding config.json works too
    assert load_model(path.parent).hidden == 1024
    # bytes counted from the config: attention (q, k, v, o) + SwiGLU MLP, bf16
    attn = 1024 * (16 + 2 * 4) * 64 + 16 * 64 * 1024
    assert m.layer_weight_bytes(0) == attn * 2 + 3 * 1024 * 4096 * 2


def test_head_dim_defaults_to_hidden_over_heads(tiny_config):
    cfg = json.loads(tiny_config().read_text())
    del cfg["head_dim"]
    assert from_hf_config(cfg).head_dim == 1024 // 16


def test_text_config_is_read():
    # multimodal configs nest the language model under text_config
    inner = json.loads(
        resources.files("pipesim.data").joinpath("models").joinpath("llama-3.1-8b.json").read_text()
    )
    m = from_hf_config({"architectures": ["X"], "text_config": inner})
    assert m.num_layers == 32 and m.hidden == 4096


def test_malformed_json_is_user_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(UserError):
        load_model(p)


def test_json_not_an_object_is_user_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[1, 2, 3]")
    with pytest.raises(UserError):
        load_model(p)


def test_missing_key_is_user_error(tiny_config):
    path = tiny_config()
    cfg = json.loads(path.read_text())
    del cfg["hidden_size"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(UserError) as exc:
        load_model(path)
    assert "hidden_size" in str(exc.value)


def test_missing_file_and_unknown_name_are_user_errors(tmp_path):
    with pytest.raises(UserError):
        load_model(tmp_path / "nope" / "config.json")
    with pytest.raises(UserError) as exc:
        load_model("no-such-model")
    assert "kimi-k2.6" in str(exc.value)  # lists the presets


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_hidden_layers": 0},
        {"num_attention_heads": 0},
        {"quantization_config": {"quant_method": "bitsandbytes"}},
    ],
)
def test_bad_values_are_user_errors(tiny_config, overrides):
    with pytest.raises(UserError):
        load_model(tiny_config(**overrides))


@pytest.mark.parametrize("value", ["abc", [1024]])
def test_non_numeric_value_is_user_error(tiny_config, value):
    with pytest.raises(UserError):
        load_model(tiny_config(hidden_size=value))


# Total parameters as the model cards publish them (billions): counted from each preset's
# config, they check the config's sizes and the MoE / attention counting together.
# gpt-oss model card: 20.9B and 116.8B; GLM-4.5 report: GLM-4.5-Air 106B, GLM-4.5/4.6 355B
# (with the one MTP layer, which pipesim does not price); Qwen3 technical report: 8.2B,
# 14.8B, 32.8B, 235B; Llama 3.1 405B.
@pytest.mark.parametrize(
    "name, billions, tol",
    [
        ("gpt-oss-20b", 20.9, 0.01),
        ("gpt-oss-120b", 116.8, 0.01),
        ("glm-4.5-air", 106, 0.02),
        ("glm-4.6", 355, 0.02),
        ("qwen3-8b", 8.2, 0.01),
        ("qwen3-14b", 14.8, 0.01),
        ("qwen3-32b", 32.8, 0.01),
        ("qwen3-235b-a22b", 235, 0.01),
        ("llama-3.1-405b", 405, 0.01),
    ],
)
def test_preset_parameter_counts_match_the_model_cards(name, billions, tol):
    assert load_model(name).total_weight_bytes("bf16") / 2e9 == pytest.approx(billions, rel=tol)


def test_gpt_oss_experts_are_mxfp4_and_every_layer_moe():
    m = load_model("gpt-oss-120b")
    assert m.moe.n_routed_experts == 128 and m.moe.topk == 4 and m.moe.moe_intermediate == 2880
    assert all(m.is_moe_layer(i) for i in range(m.num_layers))
    assert m.expert_dtype.name == "mxfp4" and m.attn_dtype.name == "bf16"  # attention unconverted


def test_fp8_presets_halve_the_bf16_weights():
    for name in ("qwen3-14b", "qwen3-32b", "qwen3-235b-a22b", "glm-4.6"):
        ratio = load_model(f"{name}-fp8").total_weight_bytes() / load_model(name).total_weight_bytes()
        # 8 of 16 bits, plus block scales and the bf16 embedding and lm_head (10% of Qwen3-14B)
        assert 0.5 < ratio < 0.56, name

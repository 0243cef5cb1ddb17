"""Weight formats from a quantization_config: bytes per parameter by hand, which modules
stay 16-bit, and a published checkpoint's size."""

from pathlib import Path

import pytest

from pipesim.base.errors import UserError
from pipesim.inputs.model import load_model
from pipesim.inputs.quantization import BF16, weight_formats

MODELS = Path(__file__).resolve().parent / "data" / "models"


def bits(fmt) -> float:
    return fmt.bytes_per_param * 8


def test_awq_int4_group_128_with_zero_points():
    # int4 weight + one fp16 scale + one packed 4-bit zero per 128 weights
    attn, experts = weight_formats({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    assert bits(attn) == pytest.approx(4 + (16 + 4) / 128)
    assert experts == attn and attn.kernel == "int4" and attn.compute == "bf16"


def test_awq_without_zero_point_and_autoawq_key_names():
    attn, _ = weight_formats({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": False})
    assert bits(attn) == pytest.approx(4 + 16 / 64)


def test_gptq_stores_zeros_and_per_channel_has_no_group_overhead():
    g128, _ = weight_formats({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True})
    assert bits(g128) == pytest.approx(4 + (16 + 4) / 128)
    int8, _ = weight_formats({"quant_method": "gptq", "bits": 8, "group_size": 32})
    assert bits(int8) == pytest.approx(8 + (16 + 8) / 32)
    channel, _ = weight_formats({"quant_method": "gptq", "bits": 4, "group_size": -1})
    assert bits(channel) == 4


def test_fp8_block_and_per_tensor():
    block, _ = weight_formats({"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert bits(block) == pytest.approx(8 + 32 / (128 * 128)) and block.compute == "fp8"
    tensor, _ = weight_formats({"quant_method": "fp8", "activation_scheme": "static"})
    assert bits(tensor) == 8


def ct(weights, acts=None, ignore=()):
    group = {"targets": ["Linear"], "weights": weights}
    if acts:
        group["input_activations"] = acts
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}, "ignore": list(ignore)}


def test_compressed_tensors_int4_weight_only_and_int8_w8a8():
    w4, _ = weight_formats(
        ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True})
    )
    assert bits(w4) == pytest.approx(4 + 16 / 128) and w4.compute == "bf16"
    w4a, _ = weight_formats(
        ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False})
    )
    assert bits(w4a) == pytest.approx(4 + (16 + 4) / 128)
    w8a8, _ = weight_formats(
        ct({"num_bits": 8, "type": "int", "strategy": "channel"}, {"num_bits": 8, "type": "int"})
    )
    assert bits(w8a8) == 8 and w8a8.compute == "int8" and w8a8.kernel == "int8"
    w8a16, _ = weight_formats(ct({"num_bits": 8, "type": "int", "strategy": "channel"}))
    assert w8a16.compute == "bf16"


def test_compressed_tensors_fp8_and_nvfp4():
    fp8, _ = weight_formats(
        ct({"num_bits": 8, "type": "float", "strategy": "channel"}, {"num_bits": 8, "type": "float"})
    )
    assert bits(fp8) == 8 and fp8.compute == "fp8"
    fp4, _ = weight_formats(
        ct(
            {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
            {"num_bits": 4, "type": "float"},
        )
    )
    assert bits(fp4) == pytest.approx(4 + 8 / 16) and fp4.compute == "fp4"


def test_modelopt_nvfp4_and_mxfp4():
    nv, _ = weight_formats({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    assert bits(nv) == pytest.approx(4.5)
    # gpt-oss: experts MXFP4 (4 bits + one e8m0 scale per 32), attention and router listed unconverted
    attn, experts = weight_formats(
        {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        }
    )
    assert attn == BF16 and bits(experts) == pytest.approx(4.25)


def test_ignore_lists_keep_attention_or_experts_16_bit():
    kimi = load_model("kimi-k2.6")  # int4 experts; attention, shared experts, dense MLP ignored
    assert kimi.attn_dtype == BF16 and bits(kimi.expert_dtype) == pytest.approx(4.5)
    # a norm named post_attention_layernorm is not attention
    attn, _ = weight_formats(
        {
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
            "modules_to_not_convert": ["lm_head", "model.layers.0.post_attention_layernorm"],
        }
    )
    assert attn != BF16
    _, experts = weight_formats(
        ct({"num_bits": 4, "type": "int", "group_size": 32}, ignore=["re:.*mlp.experts.*"])
    )
    assert experts == BF16


@pytest.mark.parametrize(
    "quant",
    [
        {"quant_method": "bitsandbytes"},
        {"quant_method": "awq", "bits": 3},
        {"quant_method": "awq", "group_size": "x"},
        {"quant_method": "compressed-tensors", "config_groups": {}},
    ],
)
def test_unmodelled_formats_are_user_errors(quant):
    with pytest.raises(UserError):
        weight_formats(quant)


def test_published_fp8_checkpoint_size():
    # Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8: its safetensors take 450 GiB on disk
    model = load_model(MODELS / "qwen3-coder-480b-a35b-fp8.json")
    assert model.total_weight_bytes() / 2**30 == pytest.approx(450, rel=0.03)


def test_awq_checkpoint_is_about_a_quarter_of_bf16():
    model = load_model(MODELS / "qwen3-coder-480b-a35b-awq.json")
    # routed experts dominate: 4.156 of 16 bits; attention, router and embeddings add the rest
    ratio = model.total_weight_bytes() / model.total_weight_bytes("bf16")
    assert (4 + 20 / 128) / 16 < ratio < 0.30


# ---- KV-cache dtype --------------------------------------------------------------------


def test_kv_cache_dtype_names_as_the_engines_spell_them():
    from pipesim.inputs.quantization import kv_cache_dtype

    assert kv_cache_dtype("auto") == "bf16"  # auto = the model's 16-bit dtype
    assert {kv_cache_dtype(n) for n in ("fp8", "fp8_e4m3", "fp8_e5m2")} == {"fp8"}
    assert kv_cache_dtype("bfloat16") == kv_cache_dtype("fp16") == "bf16"
    with pytest.raises(UserError):
        kv_cache_dtype("int3")


def test_fp8_kv_halves_bytes_per_token_and_doubles_capacity():
    from pipesim.scenario.build import build_scenario

    kw = dict(tp=1, concurrency=1, model="qwen3-30b-a3b", profile="rtx-pro-6000-vllm", engine="vllm")
    bf16, fp8 = build_scenario(**kw), build_scenario(kv_cache_dtype="fp8_e4m3", **kw)
    # Qwen3-30B-A3B: 4 KV heads x 128 x (K and V) per layer, 48 layers
    assert bf16.memory.kv_bytes_per_token[0] == 2 * 4 * 128 * 2 * 48
    assert fp8.memory.kv_bytes_per_token[0] == 2 * 4 * 128 * 1 * 48
    # the same bytes are left for KV (vLLM holds back what its profiling run peaks at, which
    # the KV dtype does not change), each token half as big
    assert fp8.memory.kv_bytes[0] == bf16.memory.kv_bytes[0]
    assert fp8.memory.kv_tokens == int(bf16.memory.kv_bytes[0] // (2 * 4 * 128 * 48))
    assert fp8.describe()["kv_cache_dtype"] == "fp8" and "kv_cache_dtype" not in bf16.describe()


def test_fp8_kv_decode_attention_reads_one_byte_per_element():
    from pipesim.costs.stage import CostModel
    from pipesim.scenario.build import build_scenario

    sc = build_scenario(
        tp=1,
        concurrency=1,
        model="llama-3.1-8b",
        profile="rtx-pro-6000-vllm",
        engine="vllm",
        kv_cache_dtype="fp8",
    )
    cm = CostModel(sc.box, sc.model, sc.plan, sc.profile)
    t, source = cm.attention_decode(64, 8192, 1)
    # the profile's decode table holds a bf16 cache: fp8 is the roofline over 1-byte elements
    reads = 64 * 8192 * 2 * 8 * 128 * 1.0
    flops = 4.0 * 64 * 32 * 8192 * 128
    gpu = sc.box.gpu
    assert source == "roofline"
    assert t == pytest.approx(max(reads / gpu.mem_bw_bytes_s, flops / gpu.flops_bf16) + cm.floor_s)

"""Weights per GPU with expert and data parallel (memory.py, docs/parallel.md §3)."""

import pytest

import pipesim
from pipesim.inputs.memory import stage_weight_bytes
from pipesim.inputs.model import load_model
from pipesim.inputs.plan import make_plan

# Qwen3-30B-A3B's public config: 48 layers, hidden 2048, 128 experts of intermediate 768,
# GQA 32 query / 4 KV heads of 128, vocab 151936, untied lm_head, bf16
L, H, E, I_MOE, HEADS, KV, HD, V = 48, 2048, 128, 768, 32, 4, 128, 151936
ROUTED = L * E * 3 * H * I_MOE * 2  # every routed expert's gate, up, down in bf16
ATTN = L * (H * (HEADS + 2 * KV) * HD + HEADS * HD * H) * 2
ROUTER = L * H * E * 2
EMBED = 2 * V * H * 2  # embedding and lm_head


def test_qwen3_30b_dp2_ep2_per_gpu():
    # vLLM --data-parallel-size 2 --enable-expert-parallel on 2 GPUs: each GPU holds all of
    # attention, router, embedding and lm_head (attention TP 1) and half the experts
    sc = pipesim.build_scenario(
        dp=2,
        enable_expert_parallel=True,
        concurrency=1,
        model="qwen3-30b-a3b",
        profile="rtx-pro-6000-vllm",
        engine="vllm",
    )
    assert (sc.plan.ep, sc.plan.gpus) == (2, 2)
    want = ATTN + ROUTER + EMBED + ROUTED / 2
    assert sc.memory.weights_per_gpu_bytes[0] == pytest.approx(want, rel=1e-9)
    assert sc.describe()["ep"] == 2 and sc.describe()["dp"] == 2


def test_ep_divides_experts_like_tp():
    # EP8 at tp 8 holds 48 whole experts per GPU; TP8 an eighth of each of 384: the same bytes
    m = load_model("kimi-k2.6")
    tp8 = make_plan(8, 1, m.num_layers, 8, "sglang", num_experts=384)
    ep8 = make_plan(8, 1, m.num_layers, 8, "sglang", ep=8, num_experts=384)
    assert stage_weight_bytes(m, ep8, 0) == pytest.approx(stage_weight_bytes(m, tp8, 0), rel=1e-12)


def test_dp_attention_memory_is_sglangs_split():
    # SGLang DP8 attention + EP8: attention whole on every GPU (attention tp 1), the
    # embedding replicated (VocabParallelEmbedding enable_tp=not is_dp_attention_enabled()),
    # lm_head, shared experts, router and the dense layer over all 8 GPUs, routed experts 1/8
    m = load_model("kimi-k2.6")
    p = make_plan(8, 1, m.num_layers, 8, "sglang", dp=8, ep=8, dp_attention=True, num_experts=384)
    routed = sum(m.routed_expert_bytes(i) for i in range(m.num_layers))
    assert routed == pytest.approx(60 * 384 * 3 * 7168 * 2048 * m.expert_dtype.bytes_per_param)
    attn = 61 * m.attention_params() * 2  # bf16 MLA projections
    embed = 163840 * 7168 * 2
    rest = m.total_weight_bytes() - routed - attn - 2 * embed
    want = attn + embed + (rest + embed) / 8 + routed / 8
    assert stage_weight_bytes(m, p, 0) == pytest.approx(want, rel=1e-12)


def test_vllm_dp_keeps_non_experts_on_each_ranks_tp():
    # vLLM DP2 x TP4 with EP8 on Kimi: all but the routed experts over each rank's 4 GPUs
    m = load_model("kimi-k2.6")
    p = make_plan(4, 1, m.num_layers, 8, "vllm", dp=2, enable_expert_parallel=True, num_experts=384)
    routed = sum(m.routed_expert_bytes(i) for i in range(m.num_layers))
    assert p.ep == 8
    assert stage_weight_bytes(m, p, 0) == pytest.approx((m.total_weight_bytes() - routed) / 4 + routed / 8)

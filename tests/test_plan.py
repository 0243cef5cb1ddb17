"""Parallel plans and the engines' layer-split rules (physics.md §6, vLLM's own tests)."""

import pytest

import pipesim
from pipesim.base.errors import UserError
from pipesim.inputs.plan import make_plan, partition


def test_sglang_kimi_pp8_split():
    # physics.md §6: the last N stages get one extra layer when layers % pp = N
    assert partition(61, 8, "sglang") == (7, 7, 7, 8, 8, 8, 8, 8)


@pytest.mark.parametrize("layers,pp,expected", [(3, 2, (2, 1)), (4, 3, (1, 2, 1)), (5, 3, (2, 2, 1))])
def test_vllm_goldens(layers, pp, expected):
    # goldens from vLLM's tests of get_pp_indices
    assert partition(layers, pp, "vllm") == expected


@pytest.mark.parametrize("rule", ["sglang", "vllm"])
@pytest.mark.parametrize("layers,pp", [(61, 8), (61, 4), (61, 3), (32, 3), (80, 7), (5, 5), (7, 1)])
def test_partition_invariants(rule, layers, pp):
    parts = partition(layers, pp, rule)
    assert len(parts) == pp and sum(parts) == layers
    assert max(parts) - min(parts) <= 1 and min(parts) >= 1


def test_make_plan_stage_gpus_and_layers():
    plan = make_plan(2, 4, 61, 8, "sglang")
    assert plan.gpus == 8
    assert plan.stage_gpus(0) == (0, 1) and plan.stage_gpus(3) == (6, 7)
    assert list(plan.stage_layers(0)) == list(range(0, 15))
    # stages are contiguous and cover every layer once
    covered = [i for s in range(4) for i in plan.stage_layers(s)]
    assert covered == list(range(61))


def test_explicit_layers():
    plan = make_plan(1, 2, 61, 8, "sglang", layers=(30, 31))
    assert plan.layers_per_stage == (30, 31)
    assert list(plan.stage_layers(1)) == list(range(30, 61))


@pytest.mark.parametrize(
    "tp,pp,layers,explicit",
    [
        (4, 4, 61, None),  # 16 GPUs on an 8-GPU box
        (8, 2, 61, None),
        (1, 8, 4, None),  # more stages than layers
        (1, 2, 61, (30, 30)),  # explicit split not summing to 61
        (1, 2, 61, (61,)),  # wrong number of stages
        (1, 2, 61, (0, 61)),  # an empty stage
        (0, 1, 61, None),
        (1, 0, 61, None),
    ],
)
def test_bad_plans_are_user_errors(tp, pp, layers, explicit):
    with pytest.raises(UserError):
        make_plan(tp, pp, layers, 8, "sglang", layers=explicit)


def test_scenario_uses_engine_rule(profile):
    # Llama-3.1-8B, 32 layers on PP3: SGLang gives the extra layers to the last stages,
    # vLLM to the first ones
    sg = pipesim.build_scenario(tp=1, pp=3, concurrency=1, model="llama-3.1-8b", profile=profile)
    vl = pipesim.build_scenario(
        tp=1, pp=3, concurrency=1, model="llama-3.1-8b", profile="rtx-pro-6000-vllm", engine="vllm"
    )
    assert sg.plan.layers_per_stage == (10, 11, 11)
    assert vl.plan.layers_per_stage == (11, 11, 10)
    kimi = pipesim.build_scenario(tp=1, pp=8, concurrency=1, profile=profile)
    assert kimi.plan.layers_per_stage == (7, 7, 7, 8, 8, 8, 8, 8)


# ---- data and expert parallel (docs/parallel.md) ------------------------------------


def test_default_plan_is_pure_tp_pp():
    # dp = ep = 1: every derived size is the TP x PP one, so no number moves
    p = make_plan(2, 4, 61, 8, "sglang", num_experts=384)
    assert (p.dp, p.ep, p.dp_attention, p.moe_spans_dp) == (1, 1, False, False)
    assert p.attn_tp == p.moe_tp == p.moe_width == 2 and p.gpus == 8
    assert p.experts_per_rank(384) == 384
    assert p.moe_gpus(3) == p.stage_gpus(3) == (6, 7)


@pytest.mark.parametrize(
    "rule,tp,pp,dp,dp_attention,gpus,attn_tp",
    [
        ("vllm", 2, 1, 4, False, 8, 2),  # vLLM: GPUs = tp x pp x dp
        ("vllm", 1, 2, 4, False, 8, 1),
        ("sglang", 8, 1, 8, True, 8, 1),  # SGLang DP attention: tp x pp GPUs, attention tp / dp
        ("sglang", 8, 1, 2, True, 8, 4),
        ("sglang", 4, 2, 4, True, 8, 1),
        ("sglang", 4, 1, 2, False, 8, 4),  # SGLang --dp without DP attention: replicas, tp x pp x dp
    ],
)
def test_gpu_count_per_engine(rule, tp, pp, dp, dp_attention, gpus, attn_tp):
    p = make_plan(tp, pp, 61, 8, rule, dp=dp, dp_attention=dp_attention, num_experts=384)
    assert p.gpus == gpus and p.attn_tp == attn_tp
    every = sorted(g for s in range(pp) for d in range(dp) for g in p.stage_gpus(s, d))
    assert every == list(range(gpus))  # each GPU in exactly one attention group


@pytest.mark.parametrize(
    "rule,tp,pp,dp,dp_attention,why",
    [
        ("vllm", 2, 1, 8, False, "16 GPUs"),  # 2 x 1 x 8 on an 8-GPU box
        ("sglang", 4, 1, 4, False, "16 GPUs"),  # replicas multiply
        ("sglang", 8, 1, 3, True, "must divide tp=8"),
        ("vllm", 8, 1, 1, True, "SGLang flag"),
        ("sglang", 8, 2, 8, True, "16 GPUs"),
    ],
)
def test_bad_dp_plans(rule, tp, pp, dp, dp_attention, why):
    with pytest.raises(UserError, match=why):
        make_plan(tp, pp, 61, 8, rule, dp=dp, dp_attention=dp_attention, num_experts=384)


def test_vllm_enable_expert_parallel_is_dp_times_tp():
    # vllm/config/parallel.py: MoE layers are sharded over tp x dp; EP replaces TP in them
    p = make_plan(1, 1, 48, 2, "vllm", dp=2, enable_expert_parallel=True, num_experts=128)
    assert (p.ep, p.moe_tp, p.moe_width, p.moe_spans_dp) == (2, 1, 2, True)
    assert p.moe_gpus(0) == (0, 1) and p.experts_per_rank(128) == 64
    q = make_plan(2, 1, 48, 8, "vllm", dp=4, enable_expert_parallel=True, num_experts=128)
    assert (q.ep, q.moe_tp, q.gpus) == (8, 1, 8)
    # without EP the MoE is tensor-parallel over the same dp x tp GPUs
    r = make_plan(2, 1, 48, 8, "vllm", dp=4, num_experts=128)
    assert (r.ep, r.moe_tp, r.moe_width) == (1, 8, 8)
    with pytest.raises(UserError, match="allowed: 1 or 8"):
        make_plan(2, 1, 48, 8, "vllm", dp=4, ep=4, num_experts=128)


def test_vllm_dp_on_a_dense_model_is_replicas():
    p = make_plan(2, 1, 32, 8, "vllm", dp=4)
    assert not p.moe_spans_dp and p.moe_width == 2 and p.gpus == 8
    assert p.stage_gpus(0, 3) == (6, 7)  # DP rank 3 holds GPUs 6, 7


@pytest.mark.parametrize("ep,moe_tp", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_sglang_ep_size_divides_tp(ep, moe_tp):
    # SGLang moe_tp_size = tp_size / ep_size
    p = make_plan(8, 1, 61, 8, "sglang", ep=ep, num_experts=384)
    assert p.moe_tp == moe_tp and p.experts_per_rank(384) == 384 // ep


def test_sglang_enable_expert_parallel_means_ep_tp():
    p = make_plan(4, 2, 61, 8, "sglang", enable_expert_parallel=True, num_experts=384)
    assert p.ep == 4 and p.moe_tp == 1


@pytest.mark.parametrize(
    "kw,why",
    [
        (dict(ep=3), "divisor of 8"),
        (dict(ep=16), "divisor of 8"),
        (dict(ep=2, num_experts=0), "mixture-of-experts"),
        (dict(ep=8, num_experts=4), "more expert-parallel ranks"),
    ],
)
def test_bad_ep(kw, why):
    kw = {"num_experts": 384, **kw}
    with pytest.raises(UserError, match=why):
        make_plan(8, 1, 61, 8, "sglang", **kw)


def test_experts_per_rank_remainder():
    # vLLM determine_expert_map: the remainder goes one each to the first ranks
    p = make_plan(4, 1, 4, 4, "sglang", ep=4, num_experts=10)
    assert p.experts_per_rank(10) == 3


def test_sglang_dp_attention_layout():
    # DP rank d of stage s: GPUs s*tp + d*attn_tp ..; the MoE spans the whole stage
    p = make_plan(4, 2, 61, 8, "sglang", dp=2, ep=4, dp_attention=True, num_experts=384)
    assert p.stage_gpus(1, 1) == (6, 7) and p.moe_gpus(1) == (4, 5, 6, 7)
    assert p.label() == "TP4xPP2xDP2-attnxEP4"


def test_dp_attention_at_dp1_is_off():
    # SGLang _handle_data_parallelism: dp_size 1 turns enable_dp_attention off
    assert not make_plan(8, 1, 61, 8, "sglang", dp=1, dp_attention=True).dp_attention

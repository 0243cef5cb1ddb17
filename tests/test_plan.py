"""Parallel plans and the engines' layer-split rules (physics.md §6, vLLM's own tests)."""

import pytest

import pipesim
from pipesim.errors import UserError
from pipesim.plan import make_plan, partition


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

"""Expert parallel: the slowest EP rank and the token traffic (moe.py, docs/parallel.md §4)."""

import dataclasses

import pytest
from conftest import without_tables

from pipesim.costs.moe import alltoall_offrank_bytes
from pipesim.costs.primitives import Shape, distinct_experts
from pipesim.costs.routing import busiest_rank, popularity
from pipesim.costs.stage import CostModel
from pipesim.inputs.box import load_box
from pipesim.inputs.plan import make_plan

BOX = "rtx-pro-6000-server-8x"


def kimi_plan(kimi, tp=8, ep=1, moe_a2a="none"):
    return make_plan(tp, 1, kimi.num_layers, 8, "sglang", ep=ep, num_experts=384, moe_a2a=moe_a2a)


def test_alltoall_bytes_per_rank():
    # a rank's buffer of rows x hidden x 2 bytes, (ep - 1) / ep of it leaves the GPU
    assert alltoall_offrank_bytes(1024, 7168, 8) == 1024 * 7168 * 2 * 7 / 8
    assert alltoall_offrank_bytes(1024, 7168, 1) == 0


@pytest.mark.parametrize("tokens", [1, 8, 32, 128, 1024])
def test_balanced_busiest_rank_is_the_even_share(tokens):
    # balanced: T k / ep slots, and the distinct-expert term over E / ep experts
    slots, distinct = busiest_rank(tokens, 384, 8, 8, "balanced")
    assert slots == pytest.approx(tokens * 8 / 8)
    assert distinct == pytest.approx(distinct_experts(tokens, 384, 8) / 8)


def test_ep1_is_the_whole_layer():
    for dist in ("balanced", "power_law_1.01", "power_law_1.2"):
        slots, _ = busiest_rank(64, 384, 8, 1, dist)
        assert slots == pytest.approx(64 * 8)


def test_skew_loads_the_busiest_rank_more():
    even, _ = busiest_rank(128, 384, 8, 8, "balanced")
    mild, _ = busiest_rank(128, 384, 8, 8, "power_law_1.01")
    steep, _ = busiest_rank(128, 384, 8, 8, "power_law_1.2")
    assert even < mild < steep <= 128 * 8
    p = popularity(384, "power_law_1.2")
    assert p.sum() == pytest.approx(1.0) and p[0] / p[1] == pytest.approx(2**1.2)


def test_ep_moe_reads_the_measured_ep_rows(profile, kimi):
    # AIConfigurator moe_perf, sglang_marlin_moe int4_wo, Kimi's shape, moe_tp 1 moe_ep 8,
    # power_law_1.01 (the profile's distribution), 128 tokens: 0.708 ms (the raw table)
    cm = CostModel(load_box(BOX), kimi, kimi_plan(kimi, ep=8), profile)
    from pipesim.costs.moe import ep_moe_time

    t, source = ep_moe_time(cm, 128)
    assert source == "measured"
    assert t == pytest.approx(0.708e-3, abs=0.001e-3)


def test_ep_moe_matches_raw_table(profile, kimi, raw_dir):
    import pandas as pd

    from pipesim.costs.moe import ep_moe_time

    df = pd.read_csv(raw_dir / "moe_perf.csv.gz")
    df = df[
        (df.kernel_source == "sglang_marlin_moe")
        & (df.hidden_size == 7168)
        & (df.num_experts == 384)
        & (df.moe_tp_size == 2)
        & (df.moe_ep_size == 4)
        & (df.distribution == "power_law_1.01")
        & (df.num_tokens == 64)
    ]
    cm = CostModel(load_box(BOX), kimi, kimi_plan(kimi, ep=4), profile)
    assert ep_moe_time(cm, 64)[0] == pytest.approx(df.latency.mean() * 1e-3, rel=1e-5)


def test_ep_roofline_without_tables(profile, kimi):
    # no moe_ep table: the busiest rank's weights read and FLOPs at the GPU's rates
    p = without_tables(profile, "moe_ep")
    p = dataclasses.replace(p, params=dataclasses.replace(p.params, moe_distribution="balanced"))
    cm = CostModel(load_box(BOX), kimi, kimi_plan(kimi, ep=8), p)
    from pipesim.costs.moe import ep_moe_time

    t, source = ep_moe_time(cm, 32)
    assert source == "roofline"
    gpu = cm.box.gpu
    slots, distinct = busiest_rank(32, 384, 8, 8, "balanced")
    nbytes = distinct * kimi.expert_params() * kimi.expert_dtype.bytes_per_param + 2 * 32 * 7168 * 2
    flops = 2 * slots * kimi.expert_params()
    want = max(nbytes / gpu.mem_bw_bytes_s, flops / gpu.flops(kimi.expert_dtype.compute)) + cm.floor_s
    assert t == pytest.approx(want, rel=1e-12)


def test_ep1_stage_ops_unchanged(profile, kimi):
    # the default plan (ep 1) costs the MoE through the TP table exactly as before
    box = load_box(BOX)
    old = CostModel(box, kimi, make_plan(8, 1, kimi.num_layers, 8, "sglang"), profile)
    new = CostModel(box, kimi, kimi_plan(kimi), profile)
    shape = Shape(decode=32, decode_ctx=600)
    assert old.stage_ops(0, shape) == new.stage_ops(0, shape)


def test_alltoall_mode_replaces_the_moe_all_reduce(profile, kimi):
    box = load_box(BOX)
    cm = CostModel(box, kimi, kimi_plan(kimi, ep=8, moe_a2a="deepep"), profile)
    ops = {o.name: o for o in cm.stage_ops(0, Shape(decode=64, decode_ctx=600))}
    gpus = tuple(range(8))
    rows = 64 * 8 / 8  # each rank dispatches its eighth of the 64 tokens, 8 experts each
    want = cm.collective("alltoall", gpus, rows * 7168 * 2)[0]
    assert ops["ep dispatch all-to-all"].seconds == want and ops["ep dispatch all-to-all"].count == 60
    assert ops["ep combine all-to-all"].seconds == want
    assert ops["mlp all-reduce"].count == 1  # the dense layer only
    assert ops["attention all-reduce"].count == 61


def test_alltoall_needs_ep():
    from pipesim.base.errors import UserError

    with pytest.raises(UserError, match="--ep > 1"):
        make_plan(8, 1, 61, 8, "sglang", num_experts=384, moe_a2a="deepep")

"""Live calibration, what is planned: the model's own GEMM shapes, required before optional,
the caps, and the routing of the MoE measurements."""

import numpy as np
import pytest

from pipesim.base.errors import UserError
from pipesim.calibrate.live import specs
from pipesim.inputs.model import load_model


def test_gemm_shapes_are_the_models_projections():
    m = load_model("llama-3.1-8b")
    shapes = specs.gemm_shapes(m, 1)
    # qkv (32 + 2 x 8 heads of 128), o, gate_up (2 x 14336), down, lm_head
    assert shapes == [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
    assert (3072, 4096) in specs.gemm_shapes(m, 2)  # qkv split over 2 GPUs


def test_plan_orders_required_first_and_respects_caps():
    m = load_model("qwen3-30b-a3b")
    g = specs.Grids()
    planned = specs.plan_specs(m, g)
    flags = [s.required for s in planned]
    assert flags == sorted(flags, reverse=True)  # every required spec before every optional one
    dec = [s for s in planned if s.table == "gqa_decode" and s.required]
    assert {s.key[:3] for s in dec} == {(32, 4, 128)}
    assert all(s.key[3] * s.key[4] <= g.decode_max_tokens for s in dec)
    moe = [s for s in planned if s.table == "moe" and s.required]
    assert {s.key[6] for s in moe} == {"balanced", "power_law_1.01"}
    assert {s.key[:6] for s in moe} == {("bf16", 2048, 768, 8, 128, 1)}
    assert len(moe) == 2 * len(g.moe_tokens)
    opt_moe = {s.key[5] for s in planned if s.table == "moe" and not s.required}
    assert opt_moe == {2, 4, 8}  # 768 splits over 2, 4 and 8 GPUs
    mla = specs.plan_specs(load_model("deepseek-v3"), g)
    assert {s.key[0] for s in mla if s.table == "mla_decode" and s.required} == {128}


def test_route_distinct_experts_and_skew():
    rng = np.random.default_rng(1)
    bal = specs.route(4096, 128, 8, "balanced", rng)
    skew = specs.route(4096, 128, 8, "power_law_1.01", rng)
    for ids in (bal, skew):
        assert ids.shape == (4096, 8) and ids.min() >= 0 and ids.max() < 128
        assert all(len(set(row)) == 8 for row in ids)  # top-k picks distinct experts
    load_bal = np.bincount(bal.ravel(), minlength=128)
    load_skew = np.bincount(skew.ravel(), minlength=128)
    assert load_bal.max() < 1.5 * load_bal.mean()  # uniform: every expert near 256 slots
    assert load_skew.max() > 3 * load_bal.max()  # Zipf: the favourite expert takes far more
    with pytest.raises(UserError, match="balanced"):
        specs.route(4, 8, 2, "zipf", rng)

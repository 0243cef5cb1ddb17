"""Live calibration, the torch operations on the CPU: the grouped MoE layer and the
split-KV decode attention against their definitions."""

import importlib.util

import numpy as np
import pytest

from pipesim.calibrate.live import kernels, specs


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_torch = pytest.mark.skipif(not has("torch"), reason="torch is not installed (pipesim[live])")
needs_transformers = pytest.mark.skipif(
    not (has("torch") and has("transformers")), reason="needs pipesim[live]"
)


@needs_torch
def test_grouped_moe_matches_per_expert_loop_and_reference():
    import torch

    g = torch.Generator().manual_seed(3)
    e, k, h, i, t = 8, 2, 64, 32, 29
    w13 = torch.randn(e, 2 * i, h, generator=g).bfloat16()
    w2 = torch.randn(e, h, i, generator=g).bfloat16()
    x = torch.randn(t, h, generator=g).bfloat16()
    ids_np = specs.route(t, e, k, "power_law_1.01", np.random.default_rng(5))
    ids = torch.as_tensor(ids_np)
    gate = torch.rand(t, k, generator=g).bfloat16()
    ref = torch.zeros(t, h)
    for tok in range(t):  # the definition, in float32
        for j in range(k):
            we = ids_np[tok, j]
            gu = w13[we].float() @ x[tok].float()
            ref[tok] += gate[tok, j].float() * (w2[we].float() @ (torch.nn.functional.silu(gu[:i]) * gu[i:]))
    loop = kernels.moe_loop(torch, x, ids, gate, w13, w2, np.bincount(ids_np.ravel(), minlength=e))().float()
    assert ((loop - ref).norm() / ref.norm()).item() < 2e-2
    if kernels.grouped_mm_fn(torch) is not None:
        grouped = kernels.moe_grouped(torch, x, ids, gate, w13, w2)().float()
        assert ((grouped - ref).norm() / ref.norm()).item() < 2e-2


@needs_torch
@pytest.mark.parametrize("splits", [1, 4])
def test_split_kv_decode_attention_matches_sdpa(splits):
    import torch

    g = torch.Generator().manual_seed(7)
    b, kv, group, d, ctx = 3, 2, 4, 32, 64
    q, k, v = (
        torch.randn(*shape, generator=g) for shape in ((b, kv, group, d), (b, kv, ctx, d), (b, kv, ctx, d))
    )
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out = kernels.split_kv_attention(torch, q.bfloat16(), k.bfloat16(), v.bfloat16(), d**-0.5, splits)()
    assert out.shape == ref.shape and ((out.float() - ref).norm() / ref.norm()).item() < 2e-2
    # MLA: one latent KV head, values a strided view of the first columns of the cache
    cache = torch.randn(b, 1, ctx, d + 8, generator=g)
    qm = torch.randn(b, 1, 16, d + 8, generator=g)
    ref = torch.softmax(qm @ cache.transpose(-1, -2) * 0.1, -1) @ cache[..., :d]
    out = kernels.split_kv_attention(
        torch, qm.bfloat16(), cache.bfloat16(), cache.bfloat16()[..., :d], 0.1, splits
    )()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2

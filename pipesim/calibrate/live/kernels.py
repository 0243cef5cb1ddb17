"""The operations timed, in plain torch, at the model's shapes: GEMMs, GQA and MLA
attention (SDPA and split-KV decode), the routed-expert MoE layer (grouped GEMM or a
per-expert loop) and sampling. torch is passed in, never imported at module level."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ...inputs.model import Model
from .specs import Spec, route
from .timing import Factory, Timed


class Ops:
    """Builds the operation each Spec times as a factory: each call allocates fresh
    inputs of the model's shapes (random data, never zeros: zeros run faster than real
    data) and returns the closure to time."""

    def __init__(self, torch: ModuleType, device: Any, model: Model):
        self.torch, self.device, self.model = torch, device, model
        self.F = torch.nn.functional
        self.dtype = torch.bfloat16
        self.moe_impl: str | None = None  # "grouped_mm" or "per-expert loop", chosen on first use
        self.sm_count = (
            torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        )

    def randn(self, *shape: int, scale: float = 1.0) -> Any:
        x = self.torch.randn(*shape, device=self.device, dtype=self.dtype)
        return x.mul_(scale) if scale != 1.0 else x

    def build(self, spec: Spec) -> Factory | list[Factory]:
        """The factory of the closure to time, or a list of alternative factories (the
        faster is kept)."""
        return getattr(self, spec.table)(*spec.key)

    def splits(self, blocks: int, context: int) -> int:
        """Context chunks for split-KV decode: enough (batch x heads x chunks) blocks to
        fill the GPU twice over, chunks of at least 256 tokens."""
        n = 1
        while blocks * n < 2 * self.sm_count and context % (2 * n) == 0 and context // (2 * n) >= 256:
            n *= 2
        return n

    # -- GEMM and attention ----------------------------------------------------------
    def gemm(self, dtype: str, m: int, n: int, k: int) -> Factory:
        def make() -> Timed:
            w, x = self.randn(n, k, scale=0.02), self.randn(m, k)
            return lambda: self.F.linear(x, w)

        return make

    def gqa_decode(
        self, heads: int, kv_heads: int, head_dim: int, batch: int, context: int
    ) -> Factory | list[Factory]:
        group = heads // kv_heads
        splits = self.splits(batch * kv_heads, context)

        def make(split: bool) -> Timed:
            q = self.randn(batch, kv_heads, group, head_dim)
            k = self.randn(batch, kv_heads, context, head_dim)
            v = self.randn(batch, kv_heads, context, head_dim)
            if split:
                return split_kv_attention(self.torch, q, k, v, head_dim**-0.5, splits)
            # one new token per request sees the whole context: no mask
            return lambda: self.F.scaled_dot_product_attention(q, k, v)

        sdpa = lambda: make(False)  # noqa: E731
        return sdpa if splits == 1 else [sdpa, lambda: make(True)]

    def gqa_prefill(self, heads: int, kv_heads: int, head_dim: int, batch: int, isl: int) -> Factory:
        sdpa = self.F.scaled_dot_product_attention

        def make() -> Timed:
            q = self.randn(batch, heads, isl, head_dim)
            k = self.randn(batch, kv_heads, isl, head_dim)
            v = self.randn(batch, kv_heads, isl, head_dim)
            if heads == kv_heads:
                return lambda: sdpa(q, k, v, is_causal=True)
            try:
                sdpa(q[:, :, :1], k[:, :, :1], v[:, :, :1], is_causal=True, enable_gqa=True)
                return lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True)
            except TypeError:  # torch < 2.5: no enable_gqa; repeat the KV heads (prefill is compute-bound)
                rep = heads // kv_heads
                k2, v2 = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
                return lambda: sdpa(q, k2, v2, is_causal=True)

        return make

    def mla_decode(self, heads: int, batch: int, context: int) -> Factory:
        a = self.model.mla
        assert a is not None  # specs.plan_specs asks an MLA model only
        latent, rope = a.kv_lora_rank, a.qk_rope_head_dim
        scale = (a.qk_nope_head_dim + a.qk_rope_head_dim) ** -0.5

        def make() -> Timed:
            q = self.randn(batch, 1, heads, latent + rope)  # q_nope already absorbed into the latent
            cache = self.randn(batch, 1, context, latent + rope)  # c_kv and k_rope of each cached token
            # one latent KV "head" shared by all query heads; the values are the latent part
            return split_kv_attention(
                self.torch, q, cache, cache[..., :latent], scale, self.splits(batch, context)
            )

        return make

    def mla_prefill(self, heads: int, batch: int, isl: int) -> Factory:
        a = self.model.mla
        assert a is not None  # specs.plan_specs asks an MLA model only
        d = a.qk_nope_head_dim + a.qk_rope_head_dim

        def make() -> Timed:
            q, k, v = (self.randn(batch, heads, isl, d) for _ in range(3))  # v (v_head_dim) padded to d
            return lambda: self.F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return make

    # -- MoE -----------------------------------------------------------------------------
    def moe(
        self,
        dtype: str,
        hidden: int,
        inter: int,
        topk: int,
        experts: int,
        moe_tp: int,
        distribution: str,
        tokens: int,
    ) -> Factory:
        torch = self.torch
        i = inter // moe_tp
        rng = np.random.default_rng(zlib.crc32(repr((distribution, tokens, experts, topk)).encode()))
        ids_np = route(tokens, experts, topk, distribution, rng)
        if self.moe_impl is None:
            self.moe_impl = self._pick_moe_impl()

        def make() -> Timed:
            w13, w2 = (
                self.randn(experts, 2 * i, hidden, scale=0.02),
                self.randn(experts, hidden, i, scale=0.02),
            )
            ids = torch.as_tensor(ids_np, device=self.device)
            gate = torch.softmax(self.randn(tokens, topk).float(), -1).to(self.dtype)
            x = self.randn(tokens, hidden)
            if self.moe_impl == "grouped_mm":
                return moe_grouped(torch, x, ids, gate, w13, w2)
            return moe_loop(torch, x, ids, gate, w13, w2, np.bincount(ids_np.ravel(), minlength=experts))

        return make

    def _pick_moe_impl(self) -> str:
        """torch's grouped GEMM (what SGLang-style fused MoE does: one launch for all
        experts, reading only the experts that got tokens) when this torch has it and it
        agrees with the per-expert loop; else the loop."""
        torch = self.torch
        if grouped_mm_fn(torch) is None:
            return "per-expert loop"
        try:
            g = torch.Generator(device=self.device).manual_seed(0)
            e, k, h, i, t = 8, 2, 64, 32, 37
            w13 = torch.randn(e, 2 * i, h, generator=g, device=self.device).to(self.dtype)
            w2 = torch.randn(e, h, i, generator=g, device=self.device).to(self.dtype)
            x = torch.randn(t, h, generator=g, device=self.device).to(self.dtype)
            ids_np = route(t, e, k, "balanced", np.random.default_rng(0))
            ids = torch.as_tensor(ids_np, device=self.device)
            gate = torch.full((t, k), 0.5, device=self.device, dtype=self.dtype)
            a = moe_grouped(torch, x, ids, gate, w13, w2)().float()
            b = moe_loop(torch, x, ids, gate, w13, w2, np.bincount(ids_np.ravel(), minlength=e))().float()
            ok = bool(((a - b).norm() / b.norm()).item() < 2e-2)
        except Exception:  # an unsupported shape, dtype or GPU: the loop is always there
            ok = False
        return "grouped_mm" if ok else "per-expert loop"

    # -- sampling -------------------------------------------------------------------------
    def sampling(self, mode: str, batch: int) -> Factory:
        torch = self.torch

        def make() -> Timed:
            logits = self.randn(batch, self.model.vocab)
            if mode == "greedy":
                return lambda: torch.argmax(logits, dim=-1)
            return lambda: torch.multinomial(torch.softmax(logits.float() / 0.7, dim=-1), 1)

        return make


def grouped_mm_fn(torch: ModuleType) -> Callable[..., Any] | None:
    """torch's grouped GEMM (public from 2.10, private since 2.8), or None."""
    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def split_kv_attention(torch: ModuleType, q: Any, k: Any, v: Any, scale: float, splits: int) -> Timed:
    """Decode attention the way flash-decoding does it, unfused: the context cut into
    `splits` chunks attended in parallel (so a small batch still fills the GPU), then
    merged by each chunk's log-sum-exp. q (b, h, g, d): the g query heads that share
    KV head h; k (b, h, ctx, d); v (b, h, ctx, dv), which may be a strided view."""
    b, h, g, _ = q.shape
    c = k.shape[2] // splits
    k5 = k.unflatten(2, (splits, c))
    v5 = v.unflatten(2, (splits, c))

    def attend() -> Any:
        s = torch.matmul(q.unsqueeze(2), k5.transpose(-1, -2)).float().mul_(scale)  # (b, h, S, g, c)
        lse = torch.logsumexp(s, -1, keepdim=True)
        o = torch.matmul(torch.exp(s - lse).to(q.dtype), v5)  # (b, h, S, g, dv)
        w = torch.softmax(lse, dim=2)  # each chunk's share
        return (o * w).sum(2).to(q.dtype)

    return attend


def _combine(torch: ModuleType, y: Any, order: Any, gate: Any, tokens: int) -> Any:
    """Each token's top-k expert outputs, weighted and summed: gather the sorted rows back
    to token order and reduce with one batched GEMV (no atomics, as engines' moe_sum)."""
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    topk = gate.shape[1]
    rows = y.index_select(0, inverse).view(tokens, topk, -1)
    return torch.bmm(gate.view(tokens, 1, topk).to(rows.dtype), rows).view(tokens, -1)


def moe_grouped(torch: ModuleType, x: Any, ids: Any, gate: Any, w13: Any, w2: Any) -> Timed:
    """Routed experts with one grouped GEMM per projection. Everything stays on the
    GPU (no host sync), so the layer can be captured in a CUDA graph."""
    gmm = grouped_mm_fn(torch)
    assert gmm is not None  # called where this torch has it (Ops._pick_moe_impl)
    experts, two_i, _ = w13.shape
    i = two_i // 2
    tokens, topk = ids.shape
    F = torch.nn.functional
    ones = torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)

    def layer() -> Any:
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.zeros(experts, dtype=torch.int32, device=ids.device).scatter_add_(0, flat, ones)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xs = x.index_select(0, order // topk)
        gu = gmm(xs, w13.transpose(1, 2), offs=offs)
        y = gmm(F.silu(gu[:, :i]) * gu[:, i:], w2.transpose(1, 2), offs=offs)
        return _combine(torch, y, order, gate, tokens)

    return layer


def moe_loop(torch: ModuleType, x: Any, ids: Any, gate: Any, w13: Any, w2: Any, counts: Any) -> Timed:
    """Routed experts as one GEMM pair per expert that received tokens (the fallback
    where torch has no grouped GEMM): reads only the touched experts' weights."""
    i = w13.shape[1] // 2
    tokens, topk = ids.shape
    F = torch.nn.functional
    bounds = np.concatenate(([0], np.cumsum(counts)))
    segments = [(e, int(bounds[e]), int(bounds[e + 1])) for e in range(len(counts)) if counts[e]]

    def layer() -> Any:
        order = torch.argsort(ids.reshape(-1), stable=True)
        xs = x.index_select(0, order // topk)
        ys = torch.empty_like(xs)
        for e, a, b in segments:
            gu = F.linear(xs[a:b], w13[e])
            ys[a:b] = F.linear(F.silu(gu[:, :i]) * gu[:, i:], w2[e])
        return _combine(torch, ys, order, gate, tokens)

    return layer

"""The decode loop's CPU costs without transformers: launching a plain-torch layer
eagerly, and the floor of a CUDA-graph decode loop."""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from ...inputs.model import Model
from .kernels import Ops
from .timing import Bench, median


def plain_layer_launch_us(torch: ModuleType, bench: Bench, ops: Ops, model: Model) -> float:
    """CPU time to launch one decoder layer at batch 1, eagerly, written in plain torch
    from the same operations as the tables (norms, QKV, rope, attention, O, MLP or
    router + MoE): the launch cost of a minimal eager layer."""
    m = model
    x = ops.randn(1, m.hidden)
    norm_w = ops.randn(m.hidden)

    def rmsnorm(h: Any) -> Any:
        v = h.float().pow(2).mean(-1, keepdim=True)
        return (h.float() * torch.rsqrt(v + 1e-6)).to(ops.dtype) * norm_w

    fns = []
    if m.mla:
        a = m.mla
        fns += [
            ops.gemm("bf16", 1, a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim, m.hidden)(),
            ops.gemm(
                "bf16", 1, m.heads * (a.qk_nope_head_dim + a.qk_rope_head_dim), a.q_lora_rank or m.hidden
            )(),
            ops.gemm("bf16", 1, m.heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank)(),
            ops.mla_decode(m.heads, 1, 256)(),
        ]
        o_in = m.heads * a.v_head_dim
    else:
        attention = ops.gqa_decode(m.heads, m.kv_heads, m.head_dim, 1, 256)
        fns += [
            ops.gemm("bf16", 1, (m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden)(),
            (attention[0] if isinstance(attention, list) else attention)(),
        ]
        o_in = m.heads * m.head_dim
    q = ops.randn(1, m.heads, m.head_dim if not m.mla else m.mla.qk_rope_head_dim)
    cos, sin = ops.randn(q.shape[-1]), ops.randn(q.shape[-1])

    def rope() -> Any:
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin

    fns += [rope, ops.gemm("bf16", 1, m.hidden, o_in)()]
    if m.moe:
        mo = m.moe
        router = ops.gemm("bf16", 1, mo.n_routed_experts, m.hidden)()
        fns += [
            lambda: torch.topk(torch.softmax(router().float(), -1), mo.topk, -1),
            ops.moe("bf16", m.hidden, mo.moe_intermediate, mo.topk, mo.n_routed_experts, 1, "balanced", 1)(),
        ]
    else:
        gu = ops.gemm("bf16", 1, 2 * m.intermediate, m.hidden)()
        fns += [
            lambda: (lambda t: ops.F.silu(t[:, : m.intermediate]) * t[:, m.intermediate :])(gu()),
            ops.gemm("bf16", 1, m.hidden, m.intermediate)(),
        ]

    def layer() -> Any:
        h = rmsnorm(x)
        for f in fns:
            f()
        return rmsnorm(x + h)

    return bench.enqueue_us(layer)


def graph_loop_floor_ms(torch: ModuleType, device: Any, reps: int = 200) -> float:
    """Per-iteration wall time of the least a CUDA-graph decode loop does: replay a
    graph, take the argmax token, copy it to the host (one sync) and append it. The
    floor of an engine's per-iteration CPU cost; its scheduler adds Python on top."""
    x = torch.randn(1, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(1024, 256, device=device, dtype=torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    torch.nn.functional.linear(x, w)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        out = torch.nn.functional.linear(x, w)
    tokens, times = [], []
    for _ in range(reps + 10):
        t = time.perf_counter()
        g.replay()
        tokens.append(out.argmax(-1).tolist())
        times.append((time.perf_counter() - t) * 1e3)
    return median(times[10:])

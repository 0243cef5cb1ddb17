#!/usr/bin/env python3
"""Measure what an eager (no CUDA graph) forward pass costs the host CPU per kernel on a
CUDA GPU, and how that compares with the GPU's own time for the same kernels.

Three measurements, each repeated `--reps` times (median and range printed as JSON):

1. `tiny_op`: back-to-back `torch.add(a, b, out=c)` on one-element tensors. Host time per
   op = time to enqueue N ops / N (the CPU cannot outrun the queue: the GPU finishes a
   one-element kernel faster than the CPU issues the next); `graph_us` = the same N ops
   captured in one CUDA graph and replayed, per op (the GPU's own per-kernel time).
2. `layer`: a Llama-3.1-8B-shaped decoder layer (hidden 4096, 32 query and 8 KV heads,
   MLP 14336, bf16, random weights) written in plain PyTorch ops, decode step at batch
   `--batch`, attention over a `--context`-token cache: eager host time per layer, the
   kernels it launches (counted with torch.profiler), host time per kernel, and the
   graph-replayed GPU time per layer. The engines fuse more (vLLM / SGLang custom ops:
   about 10-12 kernels per such layer, docs/host-loop.md); the per-kernel host time is
   the number that carries over.
3. The GPU's name, the CPU's name, torch and CUDA versions.

    python calibration/host/launch_cost.py > launch_cost_GPU.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import cpu_name  # noqa: E402


def stats(xs):
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def tiny_op(torch, n, reps):
    a = torch.ones(1, device="cuda")
    b = torch.ones(1, device="cuda")
    c = torch.empty(1, device="cuda")
    for _ in range(200):
        torch.add(a, b, out=c)
    torch.cuda.synchronize()
    host, total = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            torch.add(a, b, out=c)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / n * 1e6)
        total.append((t2 - t0) / n * 1e6)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(n):
                torch.add(a, b, out=c)
    torch.cuda.current_stream().wait_stream(s)
    graph = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        graph.append((time.perf_counter() - t0) / n * 1e6)
    return {"host_us_per_op": stats(host), "total_us_per_op": stats(total), "graph_us_per_op": stats(graph)}


def make_layer(torch, batch, context):
    F = torch.nn.functional
    h, nq, nkv, d, ffn = 4096, 32, 8, 128, 14336
    dev, dt = "cuda", torch.bfloat16
    w = {
        "ln1": torch.ones(h, device=dev, dtype=dt),
        "ln2": torch.ones(h, device=dev, dtype=dt),
        "qkv": torch.randn((nq + 2 * nkv) * d, h, device=dev, dtype=dt) * 0.02,
        "o": torch.randn(h, nq * d, device=dev, dtype=dt) * 0.02,
        "gu": torch.randn(2 * ffn, h, device=dev, dtype=dt) * 0.02,
        "down": torch.randn(h, ffn, device=dev, dtype=dt) * 0.02,
    }
    kc = torch.randn(batch, nkv, context, d, device=dev, dtype=dt)
    vc = torch.randn(batch, nkv, context, d, device=dev, dtype=dt)
    cos = torch.randn(batch, 1, 1, d, device=dev, dtype=dt)
    sin = torch.randn(batch, 1, 1, d, device=dev, dtype=dt)
    pos = torch.full((batch,), context - 1, device=dev, dtype=torch.long)

    def rms(x, wt):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + 1e-5)).to(dt) * wt

    def rope(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def layer(x):
        r = x
        x = rms(x, w["ln1"])
        qkv = F.linear(x, w["qkv"])
        q, k, v = qkv.split([nq * d, nkv * d, nkv * d], dim=-1)
        q = rope(q.view(batch, 1, nq, d).transpose(1, 2))
        k = rope(k.view(batch, 1, nkv, d).transpose(1, 2))
        kc.index_copy_(2, pos[:1], k)  # write this step's key and value into the cache
        vc.index_copy_(2, pos[:1], v.view(batch, 1, nkv, d).transpose(1, 2))
        a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        x = F.linear(a.transpose(1, 2).reshape(batch, 1, nq * d), w["o"]) + r
        r = x
        x = rms(x, w["ln2"])
        g, u = F.linear(x, w["gu"]).chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, w["down"]) + r

    x0 = torch.randn(batch, 1, h, device=dev, dtype=dt)
    return layer, x0


def layer_cost(torch, batch, context, layers, reps):
    layer, x0 = make_layer(torch, batch, context)

    def forward(x):
        for _ in range(layers):
            x = layer(x)
        return x

    with torch.no_grad():
        for _ in range(3):
            forward(x0)
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            layer(x0)
            torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
        host, total = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            forward(x0)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) / layers * 1e6)
            total.append((t2 - t0) / layers * 1e6)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            forward(x0)
            with torch.cuda.graph(g):
                forward(x0)
        torch.cuda.current_stream().wait_stream(s)
        graph = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g.replay()
            torch.cuda.synchronize()
            graph.append((time.perf_counter() - t0) / layers * 1e6)
    hk = [h / kernels for h in host]
    return {
        "batch": batch,
        "context": context,
        "kernels_per_layer": kernels,
        "eager_host_us_per_layer": stats(host),
        "eager_total_us_per_layer": stats(total),
        "eager_host_us_per_kernel": stats(hk),
        "graph_gpu_us_per_layer": stats(graph),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    import torch

    out = {
        "gpu": torch.cuda.get_device_name(0),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tiny_op": tiny_op(torch, args.n, args.reps),
        "layer": [layer_cost(torch, b, args.context, args.layers, args.reps) for b in args.batch],
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

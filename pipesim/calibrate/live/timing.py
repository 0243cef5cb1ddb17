"""How an operation is timed on one GPU.

`Bench.time_ms`: N copies of the operation, each with its own inputs and weights,
N x its working set larger than the L2 cache (so every copy reads cold data, as each
layer of a forward pass reads its own weights and KV cache), are captured back to back
into one CUDA graph (eager if capture fails), as an engine's graph runs a layer's
kernels; after warm-up, `reps` replays are bracketed by CUDA events and the median
replay time / N is kept. Before each replay the L2 cache is flushed by a read and a GPU
sleep kernel holds the GPU while the CPU queues the work, so CPU launch gaps stay out of
kernel times (the CPU side is measured separately, as the decode loop's costs).
torch is passed in, never imported at module level.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from ...base.errors import UserError

NEEDS_TORCH = "live calibration needs torch: pip install 'pipesim[live]'"

# torch is no dependency of the type check: its tensors and devices are Any here
Timed = Callable[[], Any]  # one call of the operation timed (its result, a tensor, unread)
Factory = Callable[[], Timed]  # fresh inputs and weights of the operation, then its closure

# Copies of an operation timed back to back: together COLD_FACTOR x the L2 cache, at most MAX_COPIES.
COLD_FACTOR, MAX_COPIES = 3.0, 32


def import_torch() -> ModuleType:
    try:
        import torch
    except ImportError:
        raise UserError(NEEDS_TORCH) from None
    return torch


def require_cuda(torch: ModuleType) -> None:
    if not torch.cuda.is_available():
        raise UserError(
            "no NVIDIA GPU is visible (torch.cuda.is_available() is False); "
            "live calibration times CUDA kernels on the GPUs of this machine"
        )


def median(xs: Iterable[float]) -> float:
    return float(statistics.median(xs))


class Bench:
    """Times operations on one device (see the module docstring). On a CPU device (the
    tests) it times wall clock, with no graphs, flush or sleep."""

    def __init__(self, torch: ModuleType, device: Any, reps: int, warmup: int):
        self.torch, self.device, self.reps, self.warmup = torch, device, reps, warmup
        self.cuda = device.type == "cuda"
        self.flush: Any | None = None  # on CUDA: the tensor read to flush the L2 cache
        self.cycles_per_us = 0.0
        self.l2_bytes = 0
        if self.cuda:
            props = torch.cuda.get_device_properties(device)
            self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
            self.flush = torch.empty(
                max(4 * self.l2_bytes, 256 * 2**20) // 4, dtype=torch.int32, device=device
            )
            self.cycles_per_us = self._sleep_rate()

    def _sleep_rate(self) -> float:
        """GPU clock cycles per microsecond of torch.cuda._sleep, measured (after a warm
        GPU has reached its clocks)."""
        torch = self.torch
        if not hasattr(torch.cuda, "_sleep"):
            return 0.0
        a = torch.randn(4096, 4096, device=self.device, dtype=torch.bfloat16)
        for _ in range(20):
            a @ a
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        e0.record()
        torch.cuda._sleep(cycles)
        e1.record()
        torch.cuda.synchronize()
        return cycles / max(e0.elapsed_time(e1) * 1e3, 1.0)

    def time_ms(self, make: Factory, graph: bool = True, reps: int | None = None) -> tuple[float, str]:
        """(median milliseconds of one call, method) of the closure that `make()` returns
        (a fresh one, with its own inputs, each time it is called)."""
        torch, reps = self.torch, reps or self.reps
        if not self.cuda:
            fn = make()
            for _ in range(self.warmup):
                fn()
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            return median(times), "cpu"
        before = torch.cuda.memory_allocated(self.device)
        fns = [make()]
        working_set = torch.cuda.memory_allocated(self.device) - before
        copies = max(1, min(MAX_COPIES, math.ceil(COLD_FACTOR * self.l2_bytes / max(working_set, 1))))
        fns += [make() for _ in range(copies - 1)]

        def all_copies() -> None:
            for f in fns:
                f()

        for _ in range(self.warmup):
            all_copies()
        torch.cuda.synchronize()
        run, method = all_copies, "eager"
        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    all_copies()
                g.replay()
                torch.cuda.synchronize()
                run, method = g.replay, "graph"
            except Exception:  # capture is not possible for every op (host syncs, RNG): time eagerly
                torch.cuda.synchronize()
        t = time.perf_counter()
        run()
        enqueue_us = (time.perf_counter() - t) * 1e6
        torch.cuda.synchronize()
        sleep = int(self.cycles_per_us * min(20_000.0, max(20.0, 3.0 * enqueue_us)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        flush = self.flush
        assert flush is not None  # made with the CUDA device
        for i in range(reps):
            # a read leaves clean lines in L2: the timed work pays no write-back for the flush
            flush.amax()
            if sleep:
                torch.cuda._sleep(sleep)
            starts[i].record()
            run()
            ends[i].record()
        torch.cuda.synchronize()
        return median([s.elapsed_time(e) for s, e in zip(starts, ends)]) / copies, method

    def enqueue_us(self, fn: Callable[[], object], reps: int = 20) -> float:
        """CPU microseconds to launch fn's kernels, with the GPU held busy so that no
        launch waits for it (eager launch cost)."""
        torch = self.torch
        fn()
        times = []
        for _ in range(reps):
            if self.cuda:
                torch.cuda.synchronize()
                if self.cycles_per_us:
                    torch.cuda._sleep(
                        int(self.cycles_per_us * 50_000)
                    )  # 50 ms: longer than any layer's launches
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
        if self.cuda:
            torch.cuda.synchronize()
        return median(times)

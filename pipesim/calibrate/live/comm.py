"""Collectives and P2P between the visible GPUs, one process per GPU (NCCL; gloo on the
CPU for tests). Each rank writes its rows as it measures them, so a run cut short keeps them."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ...profiles.tables import sig6
from .specs import Grids, Record
from .timing import median


def _comm_worker(
    rank: int,
    world: int,
    init_file: str,
    backend: str,
    sizes: tuple,
    reps: int,
    warmup: int,
    timeout_s: float,
    out_dir: str,
    pairs: tuple,
) -> None:
    """One rank: every group size's all-reduce and all-gather, then P2P between pairs.
    Rows go to out_dir/rank<r>.jsonl as they are measured (a run cut short keeps them)."""
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=dt.timedelta(seconds=timeout_s),
    )
    out = open(os.path.join(out_dir, f"rank{rank}.jsonl"), "a")

    def timed(op: Callable[[], object]) -> float:
        for _ in range(warmup):
            op()
        if not cuda:
            ts = []
            for _ in range(reps):
                t = time.perf_counter()
                op()
                ts.append((time.perf_counter() - t) * 1e3)
            return median(ts)
        torch.cuda.synchronize()
        ev = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)
        ]
        for a, b in ev:
            a.record()
            op()
            b.record()
        torch.cuda.synchronize()
        return median([a.elapsed_time(b) for a, b in ev])

    def emit(row: dict) -> None:
        out.write(json.dumps(row) + "\n")
        out.flush()

    try:
        groups = {g: dist.new_group(list(range(g))) for g in range(2, world + 1)}  # every rank, same order
        for g, grp in groups.items():
            for nbytes in sizes:
                n = -(-(nbytes // 2) // g) * g  # bf16 elements, divisible by the group
                for op in ("all_reduce", "all_gather"):
                    if rank < g:
                        x = torch.randn(n if op == "all_reduce" else n // g, device=dev).to(torch.bfloat16)
                        y = torch.empty(n, device=dev, dtype=torch.bfloat16)
                        fn = (
                            (lambda x=x, grp=grp: dist.all_reduce(x, group=grp))
                            if op == "all_reduce"
                            else (lambda x=x, y=y, grp=grp: dist.all_gather_into_tensor(y, x, group=grp))
                        )
                        t = torch.tensor([timed(fn)], device=dev, dtype=torch.float64)
                        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=grp)
                        if rank == 0:
                            emit(
                                {
                                    "table": "collectives",
                                    "key": [op, "nccl" if cuda else backend, g, 2 * n],
                                    "ms": float(t.item()),
                                }
                            )
            dist.barrier()
        for src, dst in pairs:
            for nbytes in sizes:
                if rank in (src, dst):
                    x = torch.randn(max(nbytes // 2, 1), device=dev).to(torch.bfloat16)
                    if rank == src:
                        for _ in range(warmup + reps):
                            dist.send(x, dst)
                    else:
                        ms = timed(partial(dist.recv, x, src))
                        emit({"table": "p2p", "key": [src, dst, 2 * x.numel()], "ms": ms})
                if cuda:
                    torch.cuda.synchronize()
            dist.barrier()
    finally:
        out.close()
        dist.destroy_process_group()


def measure_comm(
    world: int, grids: Grids, reps: int, warmup: int, limit_s: float, backend: str = "nccl"
) -> tuple[list[Record], str]:
    """Collectives and P2P with one process per GPU (torch.multiprocessing, spawn).
    A peer that never joins or hangs fails within `limit_s`: the processes started
    here are stopped and what was measured so far is kept. Returns (records, note)."""
    import tempfile

    import torch.multiprocessing as mp

    pairs = tuple((i, j) for i in range(world) for j in range(i + 1, world))
    note = "complete"
    with tempfile.TemporaryDirectory(prefix="pipesim-comm-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        timeout_s = max(30.0, min(limit_s, 300.0))
        ctx = mp.start_processes(
            _comm_worker,
            args=(world, init_file, backend, grids.comm_bytes, reps, warmup, timeout_s, tmp, pairs),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + limit_s
        try:
            while not ctx.join(timeout=2):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    note = f"cut at the {limit_s:.0f} s limit"
                    break
        except Exception as exc:  # a rank failed (a peer never joined, NCCL error): keep what was written
            note = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}"
        records = []
        for r in range(world):
            f = Path(tmp) / f"rank{r}.jsonl"
            if f.is_file():
                for line in f.read_text().splitlines():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by a stopped process
                    records.append(Record(row["table"], tuple(row["key"]), row["ms"], "events"))
    return records, note


def link_summary(p2p: list[Record]) -> dict:
    """The links' measured bandwidth (bytes/s, median over pairs at the largest size)
    and latency (us, at the smallest size) from P2P records (src, dst, nbytes); {} if none."""
    if not p2p:
        return {}
    big = max(r.key[2] for r in p2p)
    small = min(r.key[2] for r in p2p)
    return {
        "p2p_bw_bytes_s": sig6(median([r.key[2] / (r.latency_ms * 1e-3) for r in p2p if r.key[2] == big])),
        "p2p_latency_us": sig6(median([r.latency_ms * 1e3 for r in p2p if r.key[2] == small])),
    }

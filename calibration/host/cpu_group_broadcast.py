#!/usr/bin/env python3
"""Time what a TP group's CPU side pays per scheduler step to share the step's Python
objects: rank 0 pickles an object and broadcasts it over a gloo (CPU) process group,
the way SGLang's `broadcast_pyobj` (python/sglang/srt/utils.py; every loop iteration
with TP > 1, even when no request arrived) and vLLM V0's `broadcast_tensor_dict`
metadata (`broadcast_object` over the CPU group, vllm/distributed/parallel_state.py) do,
and a gloo send/recv pair between two ranks (SGLang's `point_to_point_pyobj` between PP
stages). Payloads: an empty list, a list holding one 300-token request, and a
dict-of-lists of `--batch` entries (the shape of a step's per-request metadata).

Runs `--ranks` local processes (one per rank; give the machine at least that many
cores) and prints one JSON object: per payload, the median and range over `--reps`
blocks of the per-call time on rank 0, microseconds.

    python calibration/host/cpu_group_broadcast.py --ranks 2,4,8
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import statistics
import time


def payloads(batch):
    req = {
        "rid": "r1",
        "input_ids": list(range(300)),
        "sampling": {"max_new_tokens": 300, "temperature": 0.0},
    }
    meta = {
        "req_ids": [f"r{i}" for i in range(batch)],
        "seq_lens": list(range(batch)),
        "block_tables": [[i, i + 1, i + 2] for i in range(batch)],
    }
    return {"empty": [], "one_request": [req], f"step_meta_{batch}": meta}


def bcast(dist, torch, obj, rank, group):
    """pickle on rank 0, broadcast the size, then the bytes (two gloo broadcasts)."""
    if rank == 0:
        data = pickle.dumps(obj)
        size = torch.tensor([len(data)], dtype=torch.long)
        dist.broadcast(size, src=0, group=group)
        if len(data):
            dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0, group=group)
        return obj
    size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(size, src=0, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(buf, src=0, group=group)
    return pickle.loads(buf.numpy().tobytes())


def worker(rank, world, port, args, q):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    res = {}
    for name, obj in payloads(args.batch).items():
        for _ in range(50):
            bcast(dist, torch, obj, rank, None)
        blocks = []
        for _ in range(args.reps):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.n):
                bcast(dist, torch, obj, rank, None)
            blocks.append((time.perf_counter() - t0) / args.n * 1e6)
        res[f"broadcast_{name}"] = blocks
    if world >= 2:
        obj = payloads(args.batch)["one_request"]
        blocks = []
        for _ in range(args.reps):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.n):
                if rank == 0:
                    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
                    dist.send(torch.tensor([data.numel()], dtype=torch.long), dst=1)
                    dist.send(data, dst=1)
                elif rank == 1:
                    size = torch.tensor([0], dtype=torch.long)
                    dist.recv(size, src=0)
                    buf = torch.empty(int(size.item()), dtype=torch.uint8)
                    dist.recv(buf, src=0)
                    pickle.loads(buf.numpy().tobytes())
            blocks.append((time.perf_counter() - t0) / args.n * 1e6)
        res["send_recv_one_request"] = blocks
    dist.barrier()
    if rank == 0:
        q.put(res)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = {"cpus": os.cpu_count(), "results": {}}
    for world in args.ranks:
        q = ctx.Queue()
        port = free_port()
        ps = [ctx.Process(target=worker, args=(r, world, port, args, q)) for r in range(world)]
        for p in ps:
            p.start()
        res = q.get()
        for p in ps:
            p.join()
        out["results"][str(world)] = {
            k: {
                "median_us": round(statistics.median(v), 2),
                "min_us": round(min(v), 2),
                "max_us": round(max(v), 2),
            }
            for k, v in res.items()
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A single-thread CPython speed probe, standard library only, to scale the host-loop
measurements of this folder from the CPU they ran on to another one.

The engines' host loops are interpreted Python that creates small objects, walks lists
and dicts, reads attributes and pickles messages; the probe times loops of exactly that
kind (and a pure arithmetic loop for contrast) and prints one JSON object: the CPU's
name, the Python version, and per kernel the median of `--reps` runs in nanoseconds per
inner operation. The ratio of two machines' `geomean_ns` is the factor a profile applies
to the measured host costs (same Python minor version on both, or say which differ).

    python calibration/host/cpu_speed.py > cpu_speed_THISHOST.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import cpu_name  # noqa: E402


class Req:
    __slots__ = ("rid", "tokens", "computed", "status", "params")

    def __init__(self, rid, tokens):
        self.rid, self.tokens, self.computed, self.status, self.params = rid, tokens, 0, 0, {"max": 100}


def k_objects(n):
    """create small objects and append to lists (request / output bookkeeping)"""
    out = []
    for i in range(n):
        out.append(Req(i, [i, i + 1]))
    return len(out)


def k_dict_attr(n):
    """dict lookups and attribute updates (the scheduler's per-request step)"""
    reqs = {f"r{i}": Req(i, [i]) for i in range(256)}
    keys = list(reqs)
    s = 0
    for i in range(n):
        r = reqs[keys[i & 255]]
        r.computed += 1
        r.tokens.append(i)
        if len(r.tokens) > 64:
            del r.tokens[:32]
        s += r.params["max"]
    return s


def k_sort(n):
    """sorting a list of tuples (priority queues, policies)"""
    data = [((i * 7919) % 1009, i) for i in range(512)]
    s = 0
    for _ in range(n // 512):
        s += sorted(data)[0][1]
    return s


def k_pickle(n):
    """pickle round trips of a small message (ZMQ / gloo object sends)"""
    msg = {"rids": [f"r{i}" for i in range(8)], "ids": list(range(8)), "finished": [None] * 8}
    s = 0
    for _ in range(n // 8):
        s += len(pickle.loads(pickle.dumps(msg)))
    return s


def k_arith(n):
    """pure integer and float arithmetic"""
    a, b = 0, 1.0
    for i in range(n):
        a = (a + i * 3) & 0xFFFF
        b = b * 1.0000001 + 0.5
    return a + b


KERNELS = {
    "objects": k_objects,
    "dict_attr": k_dict_attr,
    "sort": k_sort,
    "pickle": k_pickle,
    "arith": k_arith,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    res = {}
    for name, fn in KERNELS.items():
        fn(args.n // 10)  # warm-up
        ts = []
        for _ in range(args.reps):
            t0 = time.thread_time_ns()
            fn(args.n)
            ts.append((time.thread_time_ns() - t0) / args.n)
        res[name] = {
            "median_ns": round(statistics.median(ts), 2),
            "min_ns": round(min(ts), 2),
            "max_ns": round(max(ts), 2),
        }
    geo = math.exp(statistics.fmean(math.log(v["median_ns"]) for v in res.values()))
    print(
        json.dumps(
            {
                "cpu": cpu_name(),
                "python": platform.python_version(),
                "implementation": platform.python_implementation(),
                "kernels_ns_per_op": res,
                "geomean_ns": round(geo, 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

"""Benchmarks of the simulator itself (not of any GPU).

    python benchmarks/bench_sim.py [--quick] [--json OUT]

Reports, measured in one run on this machine:
1. events per second of pipesim against a bare SimPy loop of the same number of
   events (the ratio is the headline figure);
2. wall time and peak memory per scenario (TP8, PP8, TP2 x PP4 at C = 1, 8, 64, 256),
   each in a fresh process so peak memory is its own;
3. the full 8-GPU grid (every tp x pp = 8, eight concurrencies) on one and on two
   worker processes;
4. how the cost grows with concurrency, output length and GPU count (log-log slope).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

GRID_CONC = (1, 2, 4, 8, 16, 32, 64, 128)
SPLITS_8 = ((8, 1), (4, 2), (2, 4), (1, 8))


def bare_simpy(n_events: int, counting: bool = True) -> float:
    """Events per second of the simplest SimPy model: processes looping on timeouts
    (on the environment the simulator uses, which counts its events, or on plain
    simpy.Environment)."""
    import simpy

    from pipesim.sim.env import CountingEnvironment

    env = CountingEnvironment() if counting else simpy.Environment()

    def proc(env):
        while True:
            yield env.timeout(1.0)

    for _ in range(8):
        env.process(proc(env))
    t = time.perf_counter()
    env.run(until=n_events / 8)
    dt = time.perf_counter() - t
    return n_events / dt


def one(args: tuple) -> dict:
    """One scenario; returns its numbers (runs inside a worker or a child process)."""
    import pipesim

    tp, pp, conc, out_len, *model = args
    t = time.perf_counter()
    r = pipesim.predict(
        tp, pp, conc, output_len=str(out_len), model=model[0] if model else "kimi-k2.6", intervals=False
    )
    return {
        "tp": tp,
        "pp": pp,
        "conc": conc,
        "output_len": out_len,
        "events": r.sim_events,
        "sim_wall_s": r.sim_wall_s,
        "call_wall_s": time.perf_counter() - t,
        "tok_s": r.output_throughput_tok_s,
    }


def in_child(tp: int, pp: int, conc: int, out_len: int = 300) -> dict:
    """Run one scenario in a fresh interpreter and read its peak resident memory."""
    code = (
        f"import json,resource,sys; sys.path[:0]=[{sys.path[0]!r}]; from bench_sim import one; "
        f"d=one(({tp},{pp},{conc},{out_len})); "
        "d['peak_rss_mb']=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024; "
        "print(json.dumps(d))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def baseline_rss_mb() -> float:
    code = "import resource, pipesim; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024)"
    return float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )


def grid(workers: int) -> tuple[float, list]:
    jobs = [(tp, pp, c, 300) for tp, pp in SPLITS_8 for c in GRID_CONC]
    t = time.perf_counter()
    if workers == 1:
        rows = [one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(workers) as pool:
            rows = list(pool.map(one, jobs, chunksize=2))
    return time.perf_counter() - t, rows


def slope(xs, ys) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer scenarios (a smoke run)")
    ap.add_argument("--json", default=None, help="also write all numbers to this JSON file")
    args = ap.parse_args()
    report: dict = {}

    # load and index the profile's tables once, as a sweep does, so that the timings
    # below are the simulation's own
    one((8, 1, 1, 30))
    one((1, 2, 1, 30, "llama-3.1-70b"))
    print("1. events per second: pipesim vs a bare SimPy loop of the same event count")
    rows = []
    for tp, pp, c in ((8, 1, 64), (1, 8, 64), (2, 4, 64)):
        d = one((tp, pp, c, 300))
        bare = bare_simpy(d["events"])
        ev_s = d["events"] / d["sim_wall_s"]
        rows.append({**d, "events_per_s": ev_s, "bare_events_per_s": bare, "ratio": ev_s / bare})
        print(
            f"   TP{tp} x PP{pp} C={c}: {d['events']:>8,} events in {d['sim_wall_s']:.3f} s = "
            f"{ev_s:,.0f} ev/s; bare SimPy {bare:,.0f} ev/s; ratio {ev_s / bare:.2f}"
        )
    report["events"] = rows

    print("2. wall time and peak memory per scenario (fresh process each)")
    base = baseline_rss_mb()
    print(f"   (interpreter + pipesim imported: {base:.0f} MB)")
    rows = []
    concs = (1, 64) if args.quick else (1, 8, 64, 256)
    for tp, pp in ((8, 1), (1, 8), (2, 4)):
        for c in concs:
            d = in_child(tp, pp, c)
            rows.append(d)
            print(
                f"   TP{tp} x PP{pp} C={c:<4}: sim {d['sim_wall_s']:.3f} s, {d['events']:>8,} events, "
                f"peak {d['peak_rss_mb']:.0f} MB, {d['tok_s']:,.0f} tok/s"
            )
    report["scenarios"] = rows
    report["baseline_rss_mb"] = base

    if not args.quick:
        print("3. full 8-GPU grid: 4 splits x 8 concurrencies")
        t1, _ = grid(1)
        t2, _ = grid(2)
        print(f"   one process {t1:.2f} s, two processes {t2:.2f} s (speed-up {t1 / t2:.2f})")
        report["grid"] = {"one_process_s": t1, "two_processes_s": t2}

    print("4. growth: sim wall time vs concurrency and output length (TP2 x PP4), GPUs (PP, Llama-3.1-70B)")
    growth = {}
    cs = (4, 16, 64) if args.quick else (4, 16, 64, 256)
    ws = [one((2, 4, c, 300))["sim_wall_s"] for c in cs]
    growth["concurrency"] = {"x": cs, "wall_s": ws, "slope": slope(cs, ws)}
    ls = (75, 150, 300, 600)
    ws = [one((2, 4, 16, n))["sim_wall_s"] for n in ls]
    growth["output_len"] = {"x": ls, "wall_s": ws, "slope": slope(ls, ws)}
    gs = ((1, 2), (1, 4), (1, 8))  # Llama-3.1-70B: Kimi needs all 8 GPUs
    ws = [one((tp, pp, 16, 300, "llama-3.1-70b"))["sim_wall_s"] for tp, pp in gs]
    growth["gpus_pp"] = {"x": [tp * pp for tp, pp in gs], "wall_s": ws, "slope": slope([2, 4, 8], ws)}
    for k, v in growth.items():
        pts = ", ".join(f"{x}: {w:.3f}s" for x, w in zip(v["x"], v["wall_s"]))
        print(f"   {k:12s} {pts}   log-log slope {v['slope']:.2f}")
    report["growth"] = growth

    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

"""A two-stage search against simulating every plan, measured in one run.

1. Small grids where both can run (every plan simulated, as `pipesim search
   --simulate-all` would for each knob value): the wall time of the two-stage search
   (the steady-state model screens every plan, the plans its bands keep are simulated)
   against simulating every plan, as a ratio, and whether both name the same winner.
   SGLang: Kimi K2.6 on the reference box, every split of 8 GPUs x running caps
   {64, 128} x prefill chunks {4096, 8192} x C in {8, 32, 64, 128}. vLLM: Qwen3-30B-A3B
   on the same box, the splits of 8 GPUs with data parallel 1, 2 and 4 x expert
   parallel off/on x token budgets {2048, 8192} x C in {8, 64, 256}.
2. A planner's space: Qwen3-30B-A3B on three boxes (8 x RTX PRO 6000, 8 x H100 SXM,
   8 x H200 SXM) x SGLang and vLLM x prompts of 256 and 2048 tokens x the splits of 8
   GPUs with data parallel 1, 2, 4, 8 x expert parallel off/on x running caps {32 ..
   1024} x chunks {2048 .. 16384} x 25 concurrencies from 1 to 1024: 100,800 plans,
   screened and the best simulated, on the machine's cores.

    python benchmarks/bench_search.py --json search.json [--workers 2] [--only small|large]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import pandas as pd

import pipesim
from pipesim.explore.screen import PlanSpace, screen, select
from pipesim.explore.two_stage import _combo, _simulate
from pipesim.explore.workers import run_tasks

SMALL = {
    "sglang": dict(
        search=dict(gpus=8, objective="throughput", conc=[8, 32, 64, 128]),
        axes=dict(running_caps=[64, 128], chunks=[4096, 8192]),
        kwargs=dict(),
    ),
    "vllm": dict(
        search=dict(gpus=8, objective="throughput", conc=[8, 64, 256]),
        axes=dict(chunks=[2048, 8192], expert_parallel=[False, True]),
        kwargs=dict(engine="vllm", model="qwen3-30b-a3b", dp=[1, 2, 4]),
    ),
}
LOADS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
LOADS += (320, 384, 448, 512, 640, 768, 896, 1024)  # 25 concurrencies
LARGE = PlanSpace(
    gpus=(8,),
    loads=LOADS,
    open_loop=False,
    dps=(1, 2, 4, 8),
    expert_parallel=(False, True),
    running_caps=(32, 64, 128, 256, 512, 1024),
    chunks=(2048, 4096, 8192, 16384),
    boxes=("rtx-pro-6000-server-8x", "h100-sxm-8x", "h200-sxm-8x"),
    engines=("sglang", "vllm"),
    input_lens=("256", "2048"),
    output_lens=("300",),
)


def simulate_all(name: str, workers: int) -> tuple[pd.Series, int]:
    """Every plan of the small grid simulated, ranked as a search ranks a table."""
    case = SMALL[name]
    kw = {k: v for k, v in case["kwargs"].items() if k != "dp"}
    axes = case["axes"]
    space = PlanSpace(
        gpus=(8,),
        loads=tuple(case["search"]["conc"]),
        open_loop=False,
        dps=tuple(case["kwargs"].get("dp", (1,))),
        expert_parallel=tuple(axes.get("expert_parallel", (False,))),
        running_caps=tuple(axes.get("running_caps", (None,))),
        chunks=tuple(axes.get("chunks", (None,))),
        engines=(kw.pop("engine", None),),
    )
    plans, _ = screen(space, kw, workers)
    tasks = [(int(r.tp), int(r.pp), r.conc, _combo(r, i)) for i, r in plans.iterrows()]
    rows = list(run_tasks(_simulate, tasks, kw, {}, False, workers))
    table = pd.DataFrame(rows).set_index("plan_index").sort_index()
    table["split"] = plans.split
    res = pipesim.search(table=table.reset_index(drop=True), objective=case["search"]["objective"])
    return res.winner, len(rows)


def small(workers: int) -> dict:
    out = {}
    for name, case in SMALL.items():
        t, c = time.perf_counter(), cpu_s()
        staged = pipesim.search(
            **case["search"], **case["axes"], **case["kwargs"], screen=True, workers=workers
        )
        staged_s, staged_cpu = time.perf_counter() - t, cpu_s() - c
        t, c = time.perf_counter(), cpu_s()
        winner, plans = simulate_all(name, workers)
        all_s, all_cpu = time.perf_counter() - t, cpu_s() - c
        out[name] = {
            "plans": plans,
            "simulated_by_two_stage": len(staged.table),
            "two_stage_wall_s": round(staged_s, 2),
            "simulate_all_wall_s": round(all_s, 2),
            "two_stage_over_simulate_all": round(staged_s / all_s, 3),
            "two_stage_cpu_s": round(staged_cpu, 1),
            "simulate_all_cpu_s": round(all_cpu, 1),
            "two_stage_over_simulate_all_cpu": round(staged_cpu / all_cpu, 3),
            "two_stage_winner": f"{staged.winner.split} C={int(staged.winner.conc)}",
            "simulate_all_winner": f"{winner.split} C={int(winner.conc)}",
            "same_winner": (staged.winner.split, int(staged.winner.conc)) == (winner.split, int(winner.conc)),
            "two_stage_tok_s": round(float(staged.winner.output_throughput_tok_s), 1),
            "simulate_all_tok_s": round(float(winner.output_throughput_tok_s), 1),
        }
        print(name, out[name], flush=True)
    return out


def cpu_s() -> float:
    """CPU seconds of this process and of its finished worker processes."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def large(workers: int, simulate: int) -> dict:
    kw = dict(model="qwen3-30b-a3b")
    load = os.getloadavg()[0]
    t, c = time.perf_counter(), cpu_s()
    plans, skipped = screen(LARGE, kw, workers)
    screen_s, screen_cpu = time.perf_counter() - t, cpu_s() - c
    chosen, why = select(plans, "throughput", {}, simulate)
    tasks = [(int(r.tp), int(r.pp), r.conc, _combo(r, i)) for i, r in chosen.iterrows()]
    t2, c2 = time.perf_counter(), cpu_s()
    rows = list(run_tasks(_simulate, tasks, kw, {}, False, workers))
    sim_s, sim_cpu = time.perf_counter() - t2, cpu_s() - c2
    table = pd.DataFrame(rows).set_index("plan_index").sort_index()
    table["split"] = chosen.split
    best = table.sort_values("output_throughput_tok_s", ascending=False).iloc[0]
    out = {
        "plan_space": LARGE.size,
        "plans_priced": len(plans),
        "skipped_splits": len(skipped),
        "load_average_before": round(load, 2),
        "screen_wall_s": round(screen_s, 1),
        "screen_cpu_s": round(screen_cpu, 1),
        "screen_cpu_ms_per_plan": round(screen_cpu / len(plans) * 1e3, 3),
        "simulated": len(rows),
        "why": why,
        "simulate_wall_s": round(sim_s, 1),
        "simulate_cpu_s": round(sim_cpu, 1),
        "total_wall_s": round(time.perf_counter() - t, 1),
        "total_cpu_s": round(screen_cpu + sim_cpu, 1),
        "best": f"{best.box} {best.engine} in {best.input_len}: {best.split} C={int(best.conc)} "
        f"{best.output_throughput_tok_s:,.0f} tok/s",
    }
    print(out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--simulate", type=int, default=16, help="plans the large space's search simulates")
    ap.add_argument("--only", choices=("small", "large"), default=None)
    args = ap.parse_args()
    result = {"workers": args.workers, "cpus": os.cpu_count()}
    if args.only in (None, "small"):
        result["small"] = small(args.workers)
    if args.only in (None, "large"):
        result["large"] = large(args.workers, args.simulate)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

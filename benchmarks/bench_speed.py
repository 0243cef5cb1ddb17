"""Where a prediction's time and memory go, as ratios measured in one run.

    python benchmarks/bench_speed.py [--reps N] [--json OUT]

1. a whole `pipesim predict` process against a bare `python -c "import numpy, simpy"`
   (and whether predict imported pandas);
2. sim wall time at C = 4096 against C = 64 and C = 256 under the default profile's
   running cap of 64 (TP2 x PP4): the horizon follows the requests the engine admits;
3. peak resident memory of an open-loop run of 20,000 requests against 2,000, at a rate
   the engine keeps up with and at one that overloads it (its waiting queue itself
   grows with the requests), and of 20,000 kept whole (record="full") against folded;
   (`memory_open`) of 200,000 against 20,000 at the rate it keeps up with (the run's
   wall time too);
4. events per stage visit (PP8 at C = 256, TP2 x PP4 at C = 64) and the simulation's
   wall time against a bare SimPy loop (bench_sim.bare_simpy) of one event per visit;
5. the CountingEnvironment against plain simpy.Environment on the same bare loop;
6. (`--only sweep`) the wall time of a 1,000-scenario sweep on two local processes:
   the four 8-GPU splits x concurrencies 1..250, 100 output tokens, each row streamed to
   a CSV as it finishes; and the resume of the finished file (nothing left to run).

Each figure is the median of `--reps` repetitions, the two sides of a ratio measured
alternately (and, for whole processes, paired run by run) so that a noisy machine
hurts both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from bench_sim import bare_simpy  # the bare SimPy loop both benchmarks compare against

PREDICT = ["-m", "pipesim.cli", "predict", "--tp", "2", "--pp", "4", "--conc", "64"]


# children run as an installed package does: bytecode cached after the first run (an
# environment that turns bytecode writing off would time compiling pipesim's source)
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a whole child process (CPU from the OS's accounting of
    the finished child: robust on a machine shared with other jobs)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, *cmd], check=True, capture_output=True, env=CHILD_ENV)
    wall_s = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s


def child(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# beside the scenario: the same split above the running cap, and TP8 at C = 64
OTHER_PREDICTS = {
    "tp2pp4_c256": ["-m", "pipesim.cli", "predict", "--tp", "2", "--pp", "4", "--conc", "256"],
    "tp8_c64": ["-m", "pipesim.cli", "predict", "--tp", "8", "--conc", "64"],
}


def predict_vs_bare(reps: int) -> dict:
    """Whole `pipesim predict` processes against a bare `import numpy, simpy`, paired
    run by run: the issue's TP2 x PP4 C = 64 (at the running cap of 64: the clients'
    resends reach the scheduler spread out, the run settles into a cycle of 128
    requests and stops after two, steady.py) and, for comparison, the same split
    above the cap and TP8."""
    cmds = {"tp2pp4_c64": PREDICT, **OTHER_PREDICTS}
    bare, pred = [], {k: [] for k in cmds}
    for cmd in cmds.values():
        timed(cmd)  # writes the bytecode and the table cache
    for _ in range(reps):
        for k, cmd in cmds.items():
            bare.append(timed(["-c", "import numpy, simpy"]))
            pred[k].append((bare[-1], timed(cmd)))
    code = (
        "import sys, json; from pipesim.cli import main\n"
        "sys.argv = ['pipesim', 'predict', '--tp', '2', '--pp', '4', '--conc', '64', '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(json.dumps({'pandas': 'pandas' in sys.modules, 'pyarrow': 'pyarrow' in sys.modules,"
        " 'matplotlib': 'matplotlib' in sys.modules, 'scipy': 'scipy' in sys.modules, 'dask': 'dask' in sys.modules}))"
    )
    out = {"bare_cpu_s": statistics.median(b[1] for b in bare), "loaded": child(code)}
    for k, pairs in pred.items():
        out[k] = {
            "predict_cpu_s": statistics.median(p[1] for _, p in pairs),
            "ratio_cpu": statistics.median(p[1] / b[1] for b, p in pairs),
            "ratio_wall": statistics.median(p[0] / b[0] for b, p in pairs),
        }
    return out


def sim_wall(tp: int, pp: int, conc: int) -> tuple[float, float, int]:
    import pipesim

    r = pipesim.predict(tp, pp, conc, intervals=False)  # the simulation alone
    return r.sim_wall_s, r.output_throughput_tok_s, r.completed_requests


def horizon(reps: int) -> dict:
    """Sim wall and throughput at C = 64, 256 and 4096 under the running cap of 64
    (TP2 x PP4), alternated: beyond the cap the run is sized by the 64 admitted. At C =
    64 exactly every finished request's client sends its next one through the output
    path and the front end, so the replacements reach the scheduler spread out in time;
    above it they wait in the queue and are admitted at once (a different regime)."""
    sim_wall(2, 4, 64)  # profile loaded and indexed once
    loads = (64, 256, 4096)
    walls, tok, done = {c: [] for c in loads}, {}, {}
    for _ in range(reps):
        for c in loads:
            w, tok[c], done[c] = sim_wall(2, 4, c)
            walls[c].append(w)
    med = {c: statistics.median(walls[c]) for c in loads}
    out = {f"c{c}_s": med[c] for c in loads}
    out.update({f"tok_s_c{c}": tok[c] for c in loads}, **{f"requests_c{c}": done[c] for c in loads})
    out.update(ratio=med[4096] / med[64], ratio_vs_c256=med[4096] / med[256])
    return out


def open_loop(n: int, rate_rps: float, record: str = "summary") -> dict:
    """Peak RSS and wall of one open loop (TP8, 200 in / 50 out tokens) in a process of
    its own, and whether saturation.py says the engine keeps up."""
    code = (
        "import json, resource, time, pipesim\n"
        "t = time.perf_counter()\n"
        f"r = pipesim.predict(8, 1, rate_rps={rate_rps}, num_requests={n}, output_len='50', input_len='200',"
        f" record={record!r}, intervals=False)\n"
        "print(json.dumps({'wall_s': time.perf_counter() - t, 'sim_wall_s': r.sim_wall_s,"
        " 'mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,"
        " 'overloaded': r.saturation['overloaded'], 'ttft_ms_p99': r.ttft_ms_p99}))"
    )
    return child(code)


def memory(reps: int) -> dict:
    """Peak RSS of an open loop of 20,000 requests against 2,000: at 8 req/s, which TP8
    keeps up with (memory flat: the rows are folded as the run goes, no finished request
    kept), and at 50 req/s, where it is overloaded and its waiting queue itself grows
    with the requests; and 20,000 requests kept whole (record="full") against folded."""
    out = {}
    for name, rate in (("keeps_up_8rps", 8.0), ("overloaded_50rps", 50.0)):
        small, big = [], []
        for _ in range(reps):
            small.append(open_loop(2000, rate))
            big.append(open_loop(20_000, rate))
        a, b = statistics.median(r["mb"] for r in small), statistics.median(r["mb"] for r in big)
        out[name] = {
            "rss_2000_mb": a,
            "rss_20000_mb": b,
            "ratio": b / a,
            "overloaded": [any(r["overloaded"] for r in small), any(r["overloaded"] for r in big)],
        }
    full = [open_loop(20_000, 8.0, "full")["mb"] for _ in range(reps)]
    out["full_vs_summary_20000"] = statistics.median(full) / out["keeps_up_8rps"]["rss_20000_mb"]
    return out


def memory_open(reps: int, rate_rps: float = 8.0) -> dict:
    """Peak RSS and wall of an open loop of 200,000 requests against 20,000 (TP8, 50
    output tokens) at a rate it keeps up with (saturation.py says so: checked)."""
    small, big = [], []
    for _ in range(reps):
        small.append(open_loop(20_000, rate_rps))
        big.append(open_loop(200_000, rate_rps))
    out = {"rate_rps": rate_rps, "overloaded": any(r["overloaded"] for r in small + big)}
    for key in ("mb", "wall_s", "sim_wall_s"):
        a, b = statistics.median(r[key] for r in small), statistics.median(r[key] for r in big)
        out.update({f"{key}_20000": a, f"{key}_200000": b, f"{key}_ratio": b / a})
    return out


def events(reps: int) -> dict:
    """Events per stage visit, and the simulation's wall time against a bare SimPy
    loop of one event per stage visit, both measured in this process."""
    from pipesim.api import simulate
    from pipesim.scenario.build import build_scenario

    out = {}
    for name, tp, pp, conc in (("pp8_c256", 1, 8, 256), ("tp2pp4_c64", 2, 4, 64)):
        rows = []
        for _ in range(reps):
            rec, r = simulate(build_scenario(tp=tp, pp=pp, concurrency=conc))
            visits = rec.steps.visits
            bare_s = visits / bare_simpy(visits, counting=False)
            rows.append(
                (
                    r.sim_events / visits,
                    r.sim_wall_s / bare_s,
                    r.sim_events / r.sim_wall_s / bare_simpy(r.sim_events, counting=False),
                )
            )
        out[name] = {
            "events_per_stage_visit": statistics.median(x[0] for x in rows),
            "sim_wall_vs_bare_loop_of_one_event_per_visit": statistics.median(x[1] for x in rows),
            "events_per_s_vs_bare": statistics.median(x[2] for x in rows),
        }
    plain = [bare_simpy(200_000, counting=False) for _ in range(reps)]
    counting = [bare_simpy(200_000, counting=True) for _ in range(reps)]
    out["counting_env_vs_plain"] = statistics.median(counting) / statistics.median(plain)
    return out


def sweep_1000(reps: int) -> dict:
    """Once (minutes): streamed to a CSV as the rows finish, as `pipesim sweep --out` runs;
    then a resume of the finished file (every scenario built and checked, none run)."""
    import resource
    import tempfile
    from pathlib import Path

    from pipesim.explore.sweep import sweep

    def cpu_s() -> float:  # this process and its joined worker processes, user + system
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    args = dict(gpus=8, conc=list(range(1, 251)), workers=2, output_len="100")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "sweep.csv"
        t, c = time.perf_counter(), cpu_s()
        df = sweep(**args, out=out, progress=True)
        wall_s, used_s = time.perf_counter() - t, cpu_s() - c
        t = time.perf_counter()
        sweep(**args, out=out, resume=True)
        resume_s = time.perf_counter() - t
    return {"scenarios": len(df), "wall_s": wall_s, "cpu_s": used_s, "resume_finished_s": resume_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="predict,horizon,memory,memory_open,events")
    args = ap.parse_args()
    report = {}
    for name in args.only.split(","):
        report[name] = {
            "predict": predict_vs_bare,
            "horizon": horizon,
            "memory": memory,
            "memory_open": memory_open,
            "events": events,
            "sweep": sweep_1000,
        }[name](args.reps)
        print(name, json.dumps(report[name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

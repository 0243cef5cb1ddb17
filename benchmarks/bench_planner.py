"""Where a planner waits around the simulator, before and after, measured in one run.

    python benchmarks/bench_planner.py [--before SRC] [--reps N] [--json OUT] [--only a,b]

Every figure is a whole `pipesim` process (wall time, and CPU time from the operating
system's accounting of the finished process and its workers), started the way a user
starts it. With `--before SRC` (the source folder of an older pipesim: a checkout of an
earlier commit) each command also runs with that source first on PYTHONPATH, the two
alternated, so that a figure's before and after meet the same load:

1. `open_loop`: an open loop of 1,000 requests (TP8, 2 req/s, the default model and
   profile) with its default intervals against --no-intervals: the intervals' cost;
2. `startup`: each shipped box's default scenario against a bare
   `python -c "import numpy, simpy"`, paired run by run (medians of `--reps`): the
   README's `predict --tp 2 --pp 4 --conc 64` on the default box, and on every other
   box the default workload, engine and profile for that box with a model every box
   holds (Llama 3.1 8B), TP over all its GPUs, C = 64;
3. `fit`: `calibrate fit` of the reference deployment's slow all-reduce hypothesis
   (cpu_iteration_ms, allreduce_offset_us: 2 parameters, 3 points, leave-one-out) from
   a copy of the deployment's profile with its fitted parameters at 0, as
   calibration/build_profiles.py starts: its simulations, time and errors;
4. `corpus`: `validate --corpus`, its results not stored yet (cold) and again (warm);
5. `sensitivity`: `predict --tp 2 --pp 4 --conc 64 --sensitivity`, cold and warm.

The long ones (3-5) run once each; the load average is recorded at the start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BOXES = Path(__file__).resolve().parents[1] / "pipesim" / "data" / "boxes"
DEFAULT_BOX = "rtx-pro-6000-server-8x"
README_PREDICT = ["predict", "--tp", "2", "--pp", "4", "--conc", "64"]
OPEN_LOOP = ["predict", "--tp", "8", "--rate", "2", "--num-requests", "1000"]
PROFILES = Path(__file__).resolve().parents[1] / "calibration" / "profiles"
FIT = ["calibrate", "fit", "--params", "cpu_iteration_ms,allreduce_offset_us", "--no-progress"]
FITTED = ("cpu_iteration_ms", "eager_launch_us_per_layer", "allreduce_offset_us")


def env_for(src: str | None, cache: str) -> dict:
    """A child's environment: bytecode cached as an installed package runs, the given
    cache folder, and `src` first on the path (None: the installed pipesim)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env["PIPESIM_CACHE_DIR"] = cache
    if src:
        env["PYTHONPATH"] = src
    return env


def timed(args: list[str], env: dict, cwd: str, module: bool = True) -> dict:
    """Wall and CPU seconds of one whole child process (its workers' CPU included), and
    its output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    cmd = [sys.executable, *(["-m", "pipesim.cli"] if module else []), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode not in (0, 1):  # validate exits 1 when a point is off: still a run
        raise RuntimeError(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "stdout": out.stdout}


def box_scenarios(before: str | None) -> dict[str, list[str]]:
    """Each shipped box's default scenario (module docstring); with `before`, only the
    boxes the older pipesim ships too."""
    out = {DEFAULT_BOX: README_PREDICT}
    for f in sorted(BOXES.glob("*.toml")):
        if f.stem == DEFAULT_BOX:
            continue
        if before and not (Path(before) / "pipesim" / "data" / "boxes" / f.name).is_file():
            continue
        gpus = int(re.search(r"^count\s*=\s*(\d+)", f.read_text(), re.M).group(1))
        out[f.stem] = [
            "predict",
            "--box",
            f.stem,
            "--model",
            "llama-3.1-8b",
            "--tp",
            str(gpus),
            "--conc",
            "64",
        ]
    return out


def startup(sides: dict, reps: int, cwd: str) -> dict:
    """Each box's default scenario against the bare import, paired run by run."""
    bare_env = sides["after"]
    scenarios = box_scenarios(sides.get("before_src"))
    for env in (e for k, e in sides.items() if k != "before_src"):
        for args in scenarios.values():  # bytecode, parsed tables, stored lookups
            timed(args, env, cwd)
    ratios: dict = {name: {side: [] for side in sides if side != "before_src"} for name in scenarios}
    for _ in range(reps):
        for name, args in scenarios.items():
            for side, env in sides.items():
                if side == "before_src":
                    continue
                bare = timed(["-c", "import numpy, simpy"], bare_env, cwd, module=False)
                run = timed(args, env, cwd)
                ratios[name][side].append((run["cpu_s"] / bare["cpu_s"], run["wall_s"] / bare["wall_s"]))
    return {
        name: {
            side: {
                "ratio_cpu": statistics.median(r[0] for r in rs),
                "ratio_wall": statistics.median(r[1] for r in rs),
            }
            for side, rs in by_side.items()
        }
        for name, by_side in ratios.items()
    }


def open_loop(sides: dict, cwd: str) -> dict:
    out = {}
    for side, env in sides.items():
        if side == "before_src":
            continue
        on = timed(OPEN_LOOP, env, cwd)
        off = timed([*OPEN_LOOP, "--no-intervals"], env, cwd)
        out[side] = {
            "intervals_cpu_s": on["cpu_s"],
            "off_cpu_s": off["cpu_s"],
            "ratio": on["cpu_s"] / off["cpu_s"],
        }
    return out


def neutral_profile(cwd: str) -> Path:
    """A copy of the deployment's profile with the parameters its fit set back at 0."""
    folder = Path(cwd) / "neutral"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(PROFILES / "rtx-pro-6000-sglang-deployment", folder)
    toml = folder / "profile.toml"
    text = toml.read_text()
    for name in FITTED:
        text = re.sub(rf'^"{name}" = [0-9.eE+-]+$', f'"{name}" = 0.0', text, flags=re.M)
    toml.write_text(text)
    return folder


def fit(sides: dict, cwd: str) -> dict:
    out = {}
    start = neutral_profile(cwd)
    for side, env in sides.items():
        if side == "before_src":
            continue
        target = Path(cwd) / f"fitted-{side}"
        shutil.rmtree(target, ignore_errors=True)
        r = timed([*FIT, "--profile", str(start), "--out", str(target)], env, cwd)
        sims = re.findall(r"\((\d+) simulations\)", r["stdout"])
        mape = re.findall(r"MAPE ([\d.]+)%, leave-one-out MAPE ([\d.]+)%", r["stdout"])
        out[side] = {
            "wall_s": r["wall_s"],
            "cpu_s": r["cpu_s"],
            "simulations": int(sims[-1]) if sims else None,
            "mape_pct": float(mape[-1][0]) if mape else None,
            "loo_mape_pct": float(mape[-1][1]) if mape else None,
        }
    return out


def cold_warm(args: list[str], sides: dict, cwd: str) -> dict:
    """The command before (once), and after with no stored results, then again."""
    out = {}
    for side, env in sides.items():
        if side == "before_src":
            continue
        shutil.rmtree(Path(env["PIPESIM_CACHE_DIR"]) / "results", ignore_errors=True)
        cold = timed(args, env, cwd)
        out[side] = {"wall_s": cold["wall_s"], "cpu_s": cold["cpu_s"]}
        if side == "after":
            warm = timed(args, env, cwd)
            out["after_warm"] = {"wall_s": warm["wall_s"], "cpu_s": warm["cpu_s"]}
    return out


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default=None, help="source folder of an older pipesim")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="open_loop,startup,fit,corpus,sensitivity")
    a = ap.parse_args()
    only = set(a.only.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        sides: dict = {"after": env_for(None, str(Path(tmp) / "cache-after"))}
        if a.before:
            sides["before"] = env_for(str(Path(a.before).resolve()), str(Path(tmp) / "cache-before"))
            sides["before_src"] = str(Path(a.before).resolve())
        out: dict = {"load_average_start": load(), "cpus": os.cpu_count()}
        for side, env in sides.items():  # bytecode and parsed tables, as after an install's first run
            if side != "before_src":
                timed(README_PREDICT, env, tmp)
        steps = {
            "open_loop": lambda: open_loop(sides, tmp),
            "startup": lambda: startup(sides, a.reps, tmp),
            "fit": lambda: fit(sides, tmp),
            "corpus": lambda: cold_warm(["validate", "--corpus", "--no-progress"], sides, tmp),
            "sensitivity": lambda: cold_warm([*README_PREDICT, "--sensitivity"], sides, tmp),
        }
        for name, step in steps.items():
            if name in only:
                t = time.perf_counter()
                out[name] = step()
                out[name + "_bench_s"] = round(time.perf_counter() - t, 1)
                print(name, json.dumps(out[name]), file=sys.stderr, flush=True)
        out["load_average_end"] = load()
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text)


if __name__ == "__main__":
    main()

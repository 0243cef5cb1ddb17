#!/usr/bin/env python3
"""Summarise the host-loop CSVs of this folder: per engine, version, component, running
requests and step tokens, the median over repetitions of the per-repetition CPU-time
medians, and the spread (lowest and highest repetition median), in microseconds; then a
least-squares line `a + b x running` per component over the pure-decode rows (step
tokens = running) up to `--fit-max` running requests (default 512: above it the
measured costs grow faster than linearly), the form a profile takes (fixed part +
per-request part).

    python calibration/host/summarize.py calibration/host/*.csv > summary.md
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict


def fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main(paths, fit_max=512):
    groups = defaultdict(list)
    for p in paths:
        with open(p) as f:
            for r in csv.DictReader(f):
                key = (r["engine"], r["version"], r["component"], int(r["running"]), int(r["step_tokens"]))
                groups[key].append(float(r["cpu_median_us"]))
    print(
        "| engine | version | component | running | step tokens | CPU us (median of reps) | spread (rep medians) | reps |"
    )
    print("|---|---|---|---:|---:|---:|---|---:|")
    for key in sorted(groups):
        v = groups[key]
        med = statistics.median(v)
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {med:,.1f} | "
            f"{min(v):,.1f}-{max(v):,.1f} | {len(v)} |"
        )
    print()
    print(
        f"Least-squares fit over pure-decode rows (step tokens = running, running <= {fit_max}), "
        "CPU us = a + b x running:"
    )
    print()
    print("| engine | version | component | a (us) | b (us per request) | points |")
    print("|---|---|---|---:|---:|---:|")
    lines = defaultdict(list)
    for (eng, ver, comp, run, tok), v in groups.items():
        if run == tok and run <= fit_max:
            lines[(eng, ver, comp)].append((run, statistics.median(v)))
    for key in sorted(lines):
        pts = sorted(lines[key])
        if len(pts) < 2:
            continue
        a, b = fit([p[0] for p in pts], [p[1] for p in pts])
        print(f"| {key[0]} | {key[1]} | {key[2]} | {a:,.1f} | {b:,.2f} | {len(pts)} |")


if __name__ == "__main__":
    args = sys.argv[1:]
    fit_max = 512
    if "--fit-max" in args:
        i = args.index("--fit-max")
        fit_max = int(args[i + 1])
        del args[i : i + 2]
    main(args, fit_max)

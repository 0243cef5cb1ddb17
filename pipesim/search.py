"""Search: the best split and concurrency of a sweep by an objective under
constraints, the best point of every split ranked, and why the winner wins (where
the GPU time goes in it and in the runner-up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from .errors import UserError, require
from .sweep import DEFAULT_CONC, sweep

# objective -> (column, larger is better, label)
OBJECTIVES = {
    "throughput": ("output_throughput_tok_s", True, "output tok/s"),
    "throughput-per-gpu": ("output_tok_s_per_gpu", True, "output tok/s per GPU"),
    "per-request": ("per_request_tok_s", True, "per-request tok/s"),
    "ttft": ("ttft_ms_p99", False, "TTFT p99 ms"),
}


@dataclass(frozen=True)
class Search:
    """The best point under the constraints, the best point of every split ranked, and why."""

    objective: str
    constraints: dict
    winner: pd.Series
    ranked: pd.DataFrame      # the best qualifying point of each split, best first
    qualifying: int           # points that met the constraints
    table: pd.DataFrame       # the whole sweep
    why: str

    def text(self) -> str:
        col, _, label = OBJECTIVES[self.objective]
        w, t = self.winner, self.table
        lines = [f"pipesim search  {w['model']} on {w['box']} ({w['profile']}), {w['engine']}, "
                 f"objective {self.objective} ({label})"]
        if self.constraints:
            lines.append("  constraints: " + ", ".join(_constraint_text(k, v) for k, v in self.constraints.items()) +
                         f": {self.qualifying} of {len(t)} points qualify")
        lines += ["", f"best: {w['split']} ({w['gpus']} GPUs) at C={w['conc']}: {_point_text(w)}", "",
                  "ranked (the best qualifying point of each split):",
                  f"  {'#':>2} {'split':>12} {'C':>5} {'out tok/s':>10} {'per-req tok/s':>14} {'TTFT p99 ms':>12} "
                  f"{'compute':>8} {'all-red':>8} {'bubble':>8}"]
        for i, r in enumerate(self.ranked.itertuples(), 1):
            lines.append(f"  {i:>2} {r.split:>12} {r.conc:>5} {r.output_throughput_tok_s:>10,.1f} "
                         f"{r.per_request_tok_s:>14,.1f} {r.ttft_ms_p99:>12,.0f} {r.compute_share:>8.0%} "
                         f"{r.allreduce_share:>8.0%} {r.bubble_fraction:>8.0%}")
        lines += ["", "why: " + self.why]
        for s in t.attrs.get("skipped", []):
            lines.append(f"skipped {s}")
        return "\n".join(lines)


def _constraint_text(key: str, value: float) -> str:
    return {"min_per_request_tok_s": f"per-request >= {value:g} tok/s",
            "max_ttft_p99_ms": f"TTFT p99 <= {value:g} ms"}[key]


def _point_text(r) -> str:
    return (f"{r['output_throughput_tok_s']:,.1f} output tok/s, {r['per_request_tok_s']:,.1f} tok/s per request, "
            f"TTFT p99 {r['ttft_ms_p99']:,.0f} ms")


def _rank(df: pd.DataFrame, objective: str) -> pd.DataFrame:
    col, larger, _ = OBJECTIVES[objective]
    # ties: fewer GPUs, then lower concurrency, then more TP (fewer stages)
    return df.sort_values([col, "gpus", "conc", "pp"], ascending=[not larger, True, True, True], kind="stable")


def _noise(row, objective: str) -> float:
    """The 95% half-width of a point's objective: throughput has one, latencies none."""
    if objective not in ("throughput", "throughput-per-gpu") or "output_throughput_ci_tok_s" not in row:
        return 0.0
    ci = row["output_throughput_ci_tok_s"]
    ci = 0.0 if ci != ci else float(ci)
    return ci / row["gpus"] if objective == "throughput-per-gpu" else ci


def _best_of_split(part: pd.DataFrame, objective: str) -> pd.Series:
    """A split's best point: the lowest concurrency that is as good as the best within
    its 95% CI (for throughput) or float rounding: more requests in flight that add no
    throughput only queue."""
    col, larger, _ = OBJECTIVES[objective]
    top = _rank(part, objective).iloc[0]
    noise = max(_noise(top, objective), 1e-9 * abs(top[col]))
    near = part[part[col] >= top[col] - noise] if larger else part[part[col] <= top[col] + noise]
    return near.sort_values("conc", kind="stable").iloc[0]


def search(gpus: int | Sequence[int] = 8, objective: str = "throughput",
           conc: int | Sequence[int] = DEFAULT_CONC, *, min_per_request_tok_s: float | None = None,
           max_ttft_p99_ms: float | None = None, table: pd.DataFrame | None = None, **kwargs) -> Search:
    """The best split and concurrency by `objective` (one of OBJECTIVES) among the
    points that meet the constraints. Runs `sweep(gpus, conc, **kwargs)` unless a
    sweep `table` is given."""
    require(objective in OBJECTIVES, f"unknown objective '{objective}'; allowed: {', '.join(OBJECTIVES)}")
    constraints = {k: v for k, v in (("min_per_request_tok_s", min_per_request_tok_s),
                                     ("max_ttft_p99_ms", max_ttft_p99_ms)) if v is not None}
    for k, v in constraints.items():
        require(isinstance(v, (int, float)) and v == v and v >= 0, f"{k} must be a number >= 0, got {v!r}")
    df = sweep(gpus, conc, **kwargs) if table is None else table
    ok = df
    if min_per_request_tok_s is not None:
        ok = ok[ok.per_request_tok_s >= min_per_request_tok_s]
    if max_ttft_p99_ms is not None:
        ok = ok[ok.ttft_ms_p99 <= max_ttft_p99_ms]
    if ok.empty:
        fastest = df.loc[df.per_request_tok_s.idxmax()]
        quickest = df.loc[df.ttft_ms_p99.idxmin()]
        raise UserError(
            "no split and concurrency meets " + " and ".join(_constraint_text(k, v) for k, v in constraints.items()) +
            f"; the fastest per request is {fastest['split']} at C={fastest['conc']} "
            f"({fastest['per_request_tok_s']:,.1f} tok/s), the lowest TTFT p99 {quickest['split']} at "
            f"C={quickest['conc']} ({quickest['ttft_ms_p99']:,.0f} ms)")
    best = [_best_of_split(part, objective) for _, part in ok.groupby(["gpus", "tp", "pp"], sort=True)]
    ranked = _rank(pd.DataFrame(best), objective).reset_index(drop=True)
    winner = ranked.iloc[0]
    why = explain(winner, ranked.iloc[1] if len(ranked) > 1 else None, objective, df)
    return Search(objective, constraints, winner, ranked, len(ok), df, why)


def gpu_ms_per_token(row: pd.Series) -> dict[str, float]:
    """GPU time per output token (GPUs x window / tokens out) by where it went. With
    equal GPU counts the split with less of it has the higher throughput, so the
    difference in each part is what the winner wins or loses on."""
    total = row["gpus"] * 1e3 / row["output_throughput_tok_s"] if row["output_throughput_tok_s"] > 0 else float("nan")
    return {"compute": row["compute_share"] * total, "all-reduce": row["allreduce_share"] * total,
            "idle (bubble)": row["bubble_fraction"] * total}


def _per_token(win, runner) -> str:
    w, r = gpu_ms_per_token(win), gpu_ms_per_token(runner)
    text = lambda d: " + ".join(f"{k} {v:,.2f}" for k, v in d.items())  # noqa: E731
    diff = {k: r[k] - w[k] for k in w}              # > 0: the winner spends less on it
    gains = [f"{d:,.2f} ms less {k}" for k, d in sorted(diff.items(), key=lambda x: -x[1]) if d > 0.005]
    losses = [f"{-d:,.2f} ms more {k}" for k, d in sorted(diff.items(), key=lambda x: x[1]) if d < -0.005]
    out = (f"GPU time per output token: winner {sum(w.values()):,.2f} ms = {text(w)}; "
           f"runner-up {sum(r.values()):,.2f} ms = {text(r)}.")
    if gains:
        out += " The winner wins on " + ", ".join(gains) + (
            ", against " + ", ".join(losses) + "." if losses else ".")
    if win["gpus"] != runner["gpus"]:
        out += f" (It uses {win['gpus']} GPUs, the runner-up {runner['gpus']}.)"
    return out


def explain(win: pd.Series, runner: pd.Series | None, objective: str, df: pd.DataFrame) -> str:
    """Why the winner wins: its objective against the runner-up split's best point,
    and where the GPU time goes in each (compute, all-reduce, bubble)."""
    col, larger, label = OBJECTIVES[objective]
    parts = []
    if runner is None:
        parts.append(f"{win['split']} is the only split that qualifies.")
    else:
        a, b = win[col], runner[col]
        rel = (a / b - 1) if b else float("inf")
        value = (lambda v: f"a TTFT p99 of {v:,.0f} ms") if objective == "ttft" else (lambda v: f"{v:,.1f} {label}")
        parts.append(f"{win['split']} at C={win['conc']} gives {value(a)}, "
                     f"{abs(rel):.0%} {'more' if larger else 'less'} than the runner-up split "
                     f"{runner['split']} (at its best, C={runner['conc']}: {value(b)}).")
        parts.append(f"GPU time, winner vs runner-up: compute {win['compute_share']:.0%} vs {runner['compute_share']:.0%}, "
                     f"all-reduce {win['allreduce_share']:.0%} vs {runner['allreduce_share']:.0%}, "
                     f"bubble {win['bubble_fraction']:.0%} vs {runner['bubble_fraction']:.0%}.")
        noise = _noise(win, objective)
        if noise and abs(a - b) <= noise:
            parts.append(f"That is within the winner's 95% confidence interval (+/- {noise:,.1f}): on {label} "
                         "alone the two tie, so weigh their latency too.")
        if objective in ("throughput", "throughput-per-gpu"):
            parts.append(_per_token(win, runner))
        else:
            parts.append("Per-request speed and TTFT follow one token's trip through every stage: fewer stages and "
                         "more GPUs per layer shorten it, and a lower concurrency keeps the batches small.")
    if larger and objective != "per-request":
        same = df[(df.tp == win["tp"]) & (df.pp == win["pp"]) & (df.gpus == win["gpus"])]
        higher = same[same.conc > win["conc"]]
        if higher.empty:
            parts.append(f"Throughput was still rising at the largest concurrency swept (C={win['conc']}); "
                         "try a larger --conc.")
        else:
            top = higher.loc[higher[col].idxmax()]
            if top[col] > win[col] + max(_noise(win, objective), 1e-9 * abs(win[col])):
                parts.append(f"C={top['conc']} would give {top[col]:,.1f} but misses the constraints "
                             f"({top['per_request_tok_s']:,.1f} tok/s per request, TTFT p99 "
                             f"{top['ttft_ms_p99']:,.0f} ms).")
            else:
                parts.append(f"C={top['conc']} gives {top[col]:,.1f}, no more within the 95% CI, with a TTFT p99 "
                             f"of {top['ttft_ms_p99']:,.0f} ms instead of {win['ttft_ms_p99']:,.0f} ms: "
                             "the extra requests only queue.")
    return " ".join(parts)



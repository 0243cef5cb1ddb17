"""Why a search's winner wins: its objective against the runner-up split's best point,
and where the GPU time goes in each (compute, all-reduce, bubble)."""

from __future__ import annotations

import pandas as pd

from .bands import margin_text
from .objectives import OBJECTIVES, load_text, speed_text
from .objectives import noise as _noise
from .sweep import load_column


def gpu_ms_per_token(row: pd.Series) -> dict[str, float]:
    """GPU time per output token (GPUs x window / tokens out) by where it went. With
    equal GPU counts the split with less of it has the higher throughput, so the
    difference in each part is what the winner wins or loses on."""
    total = (
        row["gpus"] * 1e3 / row["output_throughput_tok_s"]
        if row["output_throughput_tok_s"] > 0
        else float("nan")
    )
    return {
        "compute": row["compute_share"] * total,
        "all-reduce": row["allreduce_share"] * total,
        "idle (bubble)": row["bubble_fraction"] * total,
    }


def _per_token(win: pd.Series, runner: pd.Series) -> str:
    w, r = gpu_ms_per_token(win), gpu_ms_per_token(runner)
    text = lambda d: " + ".join(f"{k} {v:,.2f}" for k, v in d.items())  # noqa: E731
    diff = {k: r[k] - w[k] for k in w}  # > 0: the winner spends less on it
    gains = [f"{d:,.2f} ms less {k}" for k, d in sorted(diff.items(), key=lambda x: -x[1]) if d > 0.005]
    losses = [f"{-d:,.2f} ms more {k}" for k, d in sorted(diff.items(), key=lambda x: x[1]) if d < -0.005]
    out = (
        f"GPU time per output token: winner {sum(w.values()):,.2f} ms = {text(w)}; "
        f"runner-up {sum(r.values()):,.2f} ms = {text(r)}."
    )
    if gains:
        out += (
            " The winner wins on "
            + ", ".join(gains)
            + (", against " + ", ".join(losses) + "." if losses else ".")
        )
    if win["gpus"] != runner["gpus"]:
        out += f" (It uses {win['gpus']} GPUs, the runner-up {runner['gpus']}.)"
    return out


def explain(win: pd.Series, runner: pd.Series | None, objective: str, df: pd.DataFrame) -> str:
    """Why the winner wins: its objective against the runner-up split's best point,
    and where the GPU time goes in each (compute, all-reduce, bubble)."""
    col, larger, label = OBJECTIVES[objective]
    lc = load_column(df)
    at = lambda r: load_text(r, lc)  # noqa: E731
    parts = []
    if objective == "max-load":
        return _explain_max_load(win, runner, lc)
    if runner is None:
        parts.append(f"{win['split']} is the only split that qualifies.")
    elif objective == "fewest-gpus":
        parts.append(
            f"{win['split']} meets the constraints on {win['gpus']} GPUs"
            + (
                f", fewer than the runner-up {runner['split']} ({runner['gpus']} GPUs)."
                if runner["gpus"] > win["gpus"]
                else f", as many as the runner-up {runner['split']}, with the lower TTFT p99 "
                f"({win['ttft_ms_p99']:,.0f} ms against {runner['ttft_ms_p99']:,.0f} ms): more headroom."
            )
        )
        parts.append(_per_token(win, runner))
    else:
        a, b = win[col], runner[col]
        rel = (a / b - 1) if b else float("inf")
        value = (
            (lambda v: f"a TTFT p99 of {v:,.0f} ms")
            if objective == "ttft"
            else (lambda v: f"{v:,.1f} {label}")
        )
        parts.append(
            f"{win['split']} at {at(win)} gives {value(a)}, "
            f"{abs(rel):.0%} {'more' if larger else 'less'} than the runner-up split "
            f"{runner['split']} (at its best, {at(runner)}: {value(b)})."
            + margin_text(win, runner, col, "{:,.0f}" if objective == "ttft" else "{:,.1f}")
        )
        parts.append(
            f"GPU time, winner vs runner-up: compute {win['compute_share']:.0%} vs {runner['compute_share']:.0%}, "
            f"all-reduce {win['allreduce_share']:.0%} vs {runner['allreduce_share']:.0%}, "
            f"bubble {win['bubble_fraction']:.0%} vs {runner['bubble_fraction']:.0%}."
        )
        noise = _noise(win, objective)
        if noise and abs(a - b) <= noise:
            parts.append(
                f"That is within the winner's 95% confidence interval (+/- {noise:,.1f}): on {label} "
                "alone the two tie, so weigh their latency too."
            )
        if objective in ("throughput", "throughput-per-gpu"):
            parts.append(_per_token(win, runner))
        else:
            parts.append(
                "Per-request speed and TTFT follow one token's trip through every stage: fewer stages and "
                "more GPUs per layer shorten it, and a lower concurrency keeps the batches small."
            )
    if larger and objective != "per-request":
        same = df[(df.split == win["split"]) & (df.gpus == win["gpus"])]
        higher = same[same[lc] > win[lc]]
        if higher.empty:
            parts.append(
                f"Throughput was still rising at the largest load swept ({at(win)}); "
                f"try a larger {'--rate' if lc == 'rate_rps' else '--conc'}."
            )
        else:
            top = higher.loc[higher[col].idxmax()]
            if top[col] > win[col] + max(_noise(win, objective), 1e-9 * abs(win[col])):
                parts.append(
                    f"{at(top)} would give {top[col]:,.1f} but misses the constraints "
                    f"({speed_text(top['per_request_tok_s'])} tok/s per request, TTFT p99 "
                    f"{top['ttft_ms_p99']:,.0f} ms)."
                )
            else:
                parts.append(
                    f"{at(top)} gives {top[col]:,.1f}, no more within the 95% CI, with a TTFT p99 "
                    f"of {top['ttft_ms_p99']:,.0f} ms instead of {win['ttft_ms_p99']:,.0f} ms: "
                    "the extra requests only queue."
                )
    return " ".join(parts)


def _explain_max_load(win: pd.Series, runner: pd.Series | None, lc: str) -> str:
    def one(r: pd.Series) -> str:
        nxt = r.get("next_fail")
        nxt = nxt if isinstance(nxt, str) and nxt else None  # a table's empty cell reads as NaN
        return (
            f"{r['split']} carries {load_text(r, lc)} ({r['output_throughput_tok_s']:,.1f} output tok/s, TPOT p99 "
            f"{r['tpot_ms_p99']:,.1f} ms, TTFT p99 {r['ttft_ms_p99']:,.0f} ms); "
            + (
                f"the next load swept, {nxt}"
                if nxt
                else "every load swept qualifies: sweep further to find its limit"
            )
        )

    parts = [one(win) + "."]
    if runner is not None:
        parts.append("Runner-up: " + one(runner) + ".")
        parts.append(
            f"GPU time at those loads, winner vs runner-up: compute {win['compute_share']:.0%} vs "
            f"{runner['compute_share']:.0%}, all-reduce {win['allreduce_share']:.0%} vs "
            f"{runner['allreduce_share']:.0%}, bubble {win['bubble_fraction']:.0%} vs "
            f"{runner['bubble_fraction']:.0%}: a TPOT limit is one token's trip through every stage, so "
            "fewer stages and more GPUs per layer let more requests share a step before it is reached."
        )
    else:
        parts.append(f"{win['split']} is the only split that carries a swept load.")
    return " ".join(parts)

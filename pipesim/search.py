"""Search: the best split and concurrency of a sweep by an objective under
constraints, the best point of every split ranked, and why the winner wins (where
the GPU time goes in it and in the runner-up)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from .errors import UserError, require
from .sweep import DEFAULT_CONC, load_column, sweep

# objective -> (column, larger is better, label)
OBJECTIVES = {
    "throughput": ("output_throughput_tok_s", True, "output tok/s"),
    "throughput-per-gpu": ("output_tok_s_per_gpu", True, "output tok/s per GPU"),
    "max-load": ("load", True, "the most load under the constraints"),
    "per-request": ("per_request_tok_s", True, "per-request tok/s"),
    "ttft": ("ttft_ms_p99", False, "TTFT p99 ms"),
    "fewest-gpus": ("gpus", False, "GPUs"),
}
# constraint -> (column, a point qualifies when column <= limit (True) or >= limit, text)
CONSTRAINTS = {
    "max_ttft_p50_ms": ("ttft_ms_p50", True, "TTFT p50 <= {:g} ms"),
    "max_ttft_p99_ms": ("ttft_ms_p99", True, "TTFT p99 <= {:g} ms"),
    "max_tpot_p50_ms": ("tpot_ms_p50", True, "TPOT p50 <= {:g} ms"),
    "max_tpot_p99_ms": ("tpot_ms_p99", True, "TPOT p99 <= {:g} ms"),
    "min_per_request_tok_s": ("per_request_tok_s", False, "per-request >= {:g} tok/s"),
}

COLUMN_NAMES = {
    "ttft_ms_p50": ("TTFT p50", "ms"),
    "ttft_ms_p99": ("TTFT p99", "ms"),
    "tpot_ms_p50": ("TPOT p50", "ms"),
    "tpot_ms_p99": ("TPOT p99", "ms"),
    "per_request_tok_s": ("per-request", "tok/s"),
}


@dataclass(frozen=True)
class Search:
    """The best point under the constraints, the best point of every split ranked, and why."""

    objective: str
    constraints: dict
    winner: pd.Series
    ranked: pd.DataFrame  # the best qualifying point of each split, best first
    qualifying: int  # points that met the constraints
    table: pd.DataFrame  # the whole sweep (with a `qualifies` column)
    why: str
    unqualified: tuple = ()  # max-load: splits that carry none of the swept loads, and why

    def text(self) -> str:
        _, _, label = OBJECTIVES[self.objective]
        w, t = self.winner, self.table
        lc = load_column(t)
        lines = [
            f"pipesim search  {w['model']} on {w['box']} ({w['profile']}), {w['engine']}, "
            f"objective {self.objective} ({label})"
        ]
        if self.constraints or lc == "rate_rps":
            lines.append(
                "  constraints: "
                + ", ".join(constraint_texts(self.constraints, lc))
                + f": {self.qualifying} of {len(t)} points qualify"
            )
        lines += [
            "",
            f"best: {w['split']} ({w['gpus']} GPUs) at {load_text(w, lc)}: {_point_text(w)}",
            "",
            "ranked (the best qualifying point of each split):"
            if self.objective != "max-load"
            else "ranked (per split the largest load that qualifies, with every smaller one):",
            f"  {'#':>2} {'split':>12} {'load':>10} {'out tok/s':>10} {'tok/s/GPU':>10} {'per-req':>8} "
            f"{'TTFT p99':>9} {'TPOT p99':>9} {'compute':>8} {'all-red':>8} {'bubble':>7}",
        ]
        for i, r in enumerate(self.ranked.to_dict("records"), 1):
            lines.append(
                f"  {i:>2} {r['split']:>12} {load_text(r, lc):>10} {r['output_throughput_tok_s']:>10,.1f} "
                f"{r['output_tok_s_per_gpu']:>10,.1f} {r['per_request_tok_s']:>8,.1f} "
                f"{_ms(r.get('ttft_ms_p99')):>9} {_ms(r.get('tpot_ms_p99')):>9} "
                f"{r['compute_share']:>8.0%} {r['allreduce_share']:>8.0%} {r['bubble_fraction']:>7.0%}"
            )
        for u in self.unqualified:
            lines.append(f"  -- {u}")
        lines += ["", "why: " + self.why]
        for s in t.attrs.get("skipped", []):
            lines.append(f"skipped {s}")
        return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None or v != v else f"{v:,.0f} ms"


def load_text(r: Mapping[str, object], lc: str) -> str:
    return f"{r['rate_rps']:g} req/s" if lc == "rate_rps" else f"C={int(r['conc'])}"


def constraint_texts(constraints: dict, lc: str = "conc") -> list[str]:
    out = [CONSTRAINTS[k][2].format(v) for k, v in constraints.items()]
    if lc == "rate_rps":
        out.append("not overloaded (saturation.py)")
    return out


def _constraint_text(key: str, value: float) -> str:
    return CONSTRAINTS[key][2].format(value)


def interval_text(r: Mapping[str, object], col: str) -> str:
    """A point's uncertainty on `col`, where the table has one: a prediction interval
    (`<col>_lo` / `<col>_hi` columns) or, for throughput, the 95% CI half-width."""
    lo, hi = r.get(f"{col}_lo"), r.get(f"{col}_hi")
    if lo is not None and hi is not None and lo == lo and hi == hi:
        return f" [{lo:,.1f}, {hi:,.1f}]"
    ci = r.get("output_throughput_ci_tok_s")
    if col == "output_throughput_tok_s" and ci is not None and ci == ci and round(ci, 1) > 0:
        return f" (+/- {ci:,.1f})"
    return ""


def _point_text(r) -> str:
    tpot = r.get("tpot_ms_p99")
    return (
        f"{r['output_throughput_tok_s']:,.1f}{interval_text(r, 'output_throughput_tok_s')} output tok/s "
        f"({r['output_tok_s_per_gpu']:,.1f} per GPU), {r['per_request_tok_s']:,.1f} tok/s per request, "
        f"TTFT p99 {r['ttft_ms_p99']:,.0f} ms"
        + (f", TPOT p99 {tpot:,.1f} ms" if tpot is not None and tpot == tpot else "")
    )


def _rank(df: pd.DataFrame, objective: str) -> pd.DataFrame:
    col, larger, _ = OBJECTIVES[objective]
    if objective == "fewest-gpus":  # then the most headroom: the lowest TTFT p99
        return df.sort_values(["gpus", "ttft_ms_p99", "pp"], kind="stable")
    if objective == "max-load":  # then the most throughput at that load
        return df.sort_values(
            ["load", "output_throughput_tok_s", "gpus", "pp"],
            ascending=[False, False, True, True],
            kind="stable",
        )
    # ties: fewer GPUs, then lower load, then more TP (fewer stages)
    return df.sort_values(
        [col, "gpus", "load", "pp"], ascending=[not larger, True, True, True], kind="stable"
    )


def _noise(row, objective: str) -> float:
    """The 95% half-width of a point's objective: throughput has one, latencies none."""
    if objective not in ("throughput", "throughput-per-gpu") or "output_throughput_ci_tok_s" not in row:
        return 0.0
    ci = row["output_throughput_ci_tok_s"]
    ci = 0.0 if ci != ci else float(ci)
    return ci / row["gpus"] if objective == "throughput-per-gpu" else ci


def _best_of_split(part: pd.DataFrame, objective: str) -> pd.Series:
    """A split's best point: the lowest load that is as good as the best within its
    95% CI (for throughput) or float rounding: more requests in flight that add no
    throughput only queue. (fewest-gpus: the split's most throughput.)"""
    if objective == "fewest-gpus":
        return _best_of_split(part, "throughput")
    col, larger, _ = OBJECTIVES[objective]
    top = _rank(part, objective).iloc[0]
    noise = max(_noise(top, objective), 1e-9 * abs(top[col]))
    near = part[part[col] >= top[col] - noise] if larger else part[part[col] <= top[col] + noise]
    return near.sort_values("load", kind="stable").iloc[0]


def _carried(part: pd.DataFrame) -> tuple[pd.Series | None, pd.Series | None]:
    """max-load, one split: the largest load such that it and every smaller swept load
    qualify, and the first load that does not (None: every one does)."""
    part = part.sort_values("load", kind="stable")
    fails = part[~part.qualifies]
    first_fail = fails.iloc[0] if len(fails) else None
    ok = part if first_fail is None else part[part.load < first_fail["load"]]
    return (ok.iloc[-1] if len(ok) else None), first_fail


def _misses(r, constraints: dict) -> str:
    """What a point misses: each constraint it breaks, with its value."""
    out = []
    for k, limit in constraints.items():
        col, at_most, text = CONSTRAINTS[k]
        v = r[col]
        if v != v or (v > limit if at_most else v < limit):
            name, unit = COLUMN_NAMES[col]
            out.append(f"{name} {v:,.1f} {unit} (needs {text.format(limit)})")
    if bool(r.get("overloaded", False)):
        out.append(f"overloaded ({r.get('served_req_s', float('nan')):.2f} req/s served)")
    return ", ".join(out) or "nothing"


def search(
    gpus: int | Sequence[int] = 8,
    objective: str = "throughput",
    conc: int | Sequence[int] | None = DEFAULT_CONC,
    *,
    rate: float | Sequence[float] | None = None,
    splits: Sequence[tuple[int, int]] | None = None,
    min_per_request_tok_s: float | None = None,
    max_ttft_p50_ms: float | None = None,
    max_ttft_p99_ms: float | None = None,
    max_tpot_p50_ms: float | None = None,
    max_tpot_p99_ms: float | None = None,
    table: pd.DataFrame | None = None,
    **kwargs: object,
) -> Search:
    """The best split and load by `objective` (one of OBJECTIVES) among the points that
    meet the constraints (an overloaded open-loop point never does). Runs
    `sweep(gpus, conc, rate=rate, splits=splits, **kwargs)` unless a sweep `table` is
    given; `splits` [(tp, pp), ...] limits it to those splits.

    max-load: per split the largest load (concurrency, or arrival rate with `rate`)
    that qualifies together with every smaller swept load; splits ranked by it."""
    require(objective in OBJECTIVES, f"unknown objective '{objective}'; allowed: {', '.join(OBJECTIVES)}")
    given = dict(
        min_per_request_tok_s=min_per_request_tok_s,
        max_ttft_p50_ms=max_ttft_p50_ms,
        max_ttft_p99_ms=max_ttft_p99_ms,
        max_tpot_p50_ms=max_tpot_p50_ms,
        max_tpot_p99_ms=max_tpot_p99_ms,
    )
    constraints = {k: v for k, v in given.items() if v is not None}
    for k, v in constraints.items():
        require(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0,
            f"{k} must be a number >= 0, got {v!r}",
        )
    if splits is not None:
        splits = [tuple(s) for s in splits]
    if table is None:
        if splits is not None:
            gpus = sorted({tp * pp for tp, pp in splits})
        df = sweep(gpus, conc, rate=rate, splits=splits, **kwargs)
    else:
        df = table
        if splits is not None:
            keep = df[[(tp, pp) in splits for tp, pp in zip(df.tp, df.pp)]]
            require(
                len(keep) > 0,
                "none of the splits "
                + ", ".join(f"{tp}x{pp}" for tp, pp in splits)
                + " is in the table; it has "
                + ", ".join(sorted({f"{tp}x{pp}" for tp, pp in zip(df.tp, df.pp)})),
            )
            keep.attrs = dict(df.attrs)
            df = keep
    df = df.copy()
    lc = load_column(df)
    df["load"] = df[lc]
    ok_mask = pd.Series(True, index=df.index)
    for k, v in constraints.items():
        col, at_most, _ = CONSTRAINTS[k]
        require(
            col in df.columns,
            f"the sweep table has no {col} column for {k}; rerun the sweep with this pipesim",
        )
        ok_mask &= (df[col] <= v) if at_most else (df[col] >= v)
    if "overloaded" in df.columns and lc == "rate_rps":
        ok_mask &= ~df.overloaded.astype(bool)
    df["qualifies"] = ok_mask
    ok = df[ok_mask]
    if ok.empty:
        fastest = df.loc[df.per_request_tok_s.idxmax()]
        quickest = df.loc[df.ttft_ms_p99.idxmin()]
        raise UserError(
            f"no split and {'arrival rate' if lc == 'rate_rps' else 'concurrency'} meets "
            + " and ".join(constraint_texts(constraints, lc))
            + f"; the fastest per request is {fastest['split']} at {load_text(fastest, lc)} "
            f"({fastest['per_request_tok_s']:,.1f} tok/s), the lowest TTFT p99 {quickest['split']} at "
            f"{load_text(quickest, lc)} ({quickest['ttft_ms_p99']:,.0f} ms)"
        )
    unqualified = []
    if objective == "max-load":
        best = []
        for _, part in df.groupby(["gpus", "split"], sort=True):
            carried, fail = _carried(part)
            if carried is None:
                unqualified.append(
                    f"{fail['split']} carries none of the swept loads: at {load_text(fail, lc)} "
                    f"it misses {_misses(fail, constraints)}"
                )
            else:
                best.append(carried.copy())
                best[-1]["next_fail"] = (
                    None if fail is None else f"{load_text(fail, lc)}: {_misses(fail, constraints)}"
                )
    else:
        best = [_best_of_split(part, objective) for _, part in ok.groupby(["gpus", "split"], sort=True)]
    ranked = _rank(pd.DataFrame(best), objective).reset_index(drop=True)
    winner = ranked.iloc[0]
    why = explain(winner, ranked.iloc[1] if len(ranked) > 1 else None, objective, df)
    return Search(objective, constraints, winner, ranked, int(ok_mask.sum()), df, why, tuple(unqualified))


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


def _per_token(win, runner) -> str:
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
                    f"({top['per_request_tok_s']:,.1f} tok/s per request, TTFT p99 "
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
    def one(r) -> str:
        nxt = r.get("next_fail")
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

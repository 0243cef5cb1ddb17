"""Search: the best split and concurrency of a sweep by an objective under
constraints, the best point of every split ranked, and why the winner wins (where
the GPU time goes in it and in the runner-up)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..base.checks import MAX_SIMULATE
from ..base.errors import UserError, require
from ..base.jsonout import plain
from .bands import band_of
from .conditions import condition_text, conditions
from .objectives import (
    COLUMN_NAMES,
    CONSTRAINTS,
    OBJECTIVES,
    constraint_texts,
    interval_text,
    load_text,
    speed_text,
)
from .objectives import noise as _noise
from .search_why import explain, gpu_ms_per_token
from .sweep import DEFAULT_CONC, load_column, sweep
from .two_stage import model_text, two_stage

if TYPE_CHECKING:
    from .objectives import Row


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
    condition: dict = field(default_factory=dict)  # the condition searched, where the table has several
    across: tuple = ()  # with across_conditions: the conditions ranked together
    screen: str = ""  # a two-stage search: what the model screened and why these were simulated

    def text(self) -> str:
        _, _, label = OBJECTIVES[self.objective]
        w, t = self.winner, self.table
        lc = load_column(t)
        lines = [
            f"pipesim search  {w['model']} on {w['box']} ({w['profile']}), {w['engine']}, "
            f"objective {self.objective} ({label})"
            + (f"  [{condition_text(self.condition)}]" if self.condition else "")
        ]
        if self.across:
            lines.append(
                f"  one best over {len(self.across)} conditions, as asked (each split named with its own): "
                + "; ".join(condition_text(c) for c in self.across)
            )
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
            f"  {'#':>2} {'split':>12} {'load':>10} {'out tok/s':>10} {'likely':>13} {'tok/s/GPU':>10} {'per-req':>8} "
            f"{'TTFT p99':>9} {'TPOT p99':>9} {'compute':>8} {'all-red':>8} {'bubble':>7}",
        ]
        for i, r in enumerate(self.ranked.to_dict("records"), 1):
            lines.append(
                f"  {i:>2} {r['split']:>12} {load_text(r, lc):>10} {r['output_throughput_tok_s']:>10,.1f} "
                f"{_likely(r):>13} "
                f"{r['output_tok_s_per_gpu']:>10,.1f} {speed_text(r['per_request_tok_s']):>8} "
                f"{_ms(r.get('ttft_ms_p99')):>9} {_ms(r.get('tpot_ms_p99')):>9} "
                f"{r['compute_share']:>8.0%} {r['allreduce_share']:>8.0%} {r['bubble_fraction']:>7.0%}"
                + model_text(r)
            )
        for u in self.unqualified:
            lines.append(f"  -- {u}")
        lines += ["", "why: " + self.why]
        if self.screen:
            lines += ["", self.screen]
        for s in t.attrs.get("skipped", []):
            lines.append(f"skipped {s}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """What `pipesim search --json` prints: the answer, the ranking, why (strict JSON:
        a missing figure is null)."""
        return plain(
            {
                "objective": self.objective,
                "constraints": self.constraints,
                "condition": self.condition,
                "across_conditions": list(self.across),
                "points": len(self.table),
                "qualifying": self.qualifying,
                "best": dict(self.winner),
                "ranked": self.ranked.to_dict("records"),
                "unqualified": list(self.unqualified),
                "why": self.why,
                "screen": self.screen,
                "skipped": list(self.table.attrs.get("skipped", [])),
            }
        )


@dataclass(frozen=True)
class Searches:
    """A search of a table of several conditions: one Search per condition (each split
    ranked within its own), and the conditions where no point qualifies, with why."""

    results: tuple[Search, ...]
    failed: tuple[str, ...]
    table: pd.DataFrame
    screen: str = ""  # a two-stage search: what the model screened

    def text(self) -> str:
        blocks = [
            f"{len(self.results) + len(self.failed)} conditions in the table, searched one by one "
            "(a split ranks only against the splits of its own condition)"
        ]
        blocks += [r.text() for r in self.results]
        blocks += [f"nothing qualifies {f}" for f in self.failed]
        blocks += ["\n".join(f"skipped {s}" for s in self.table.attrs.get("skipped", []))]
        blocks += [self.screen]
        return "\n\n".join(blocks).rstrip()

    def to_dict(self) -> dict:
        """`pipesim search --json` of several conditions: one answer per condition."""
        return plain(
            {
                "conditions": [r.to_dict() for r in self.results],
                "failed": list(self.failed),
                "screen": self.screen,
                "skipped": list(self.table.attrs.get("skipped", [])),
            }
        )


def _likely(r: Row) -> str:
    """A ranked point's likely band of output tok/s, '-' where the table has none."""
    band = band_of(r, "output_throughput_tok_s")
    return "-" if band is None else f"{band[0]:,.0f}-{band[1]:,.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:,.0f} ms"


def _point_text(r: Row) -> str:
    tpot = r.get("tpot_ms_p99")
    return (
        f"{r['output_throughput_tok_s']:,.1f}{interval_text(r, 'output_throughput_tok_s')} output tok/s "
        f"({r['output_tok_s_per_gpu']:,.1f} per GPU), {speed_text(r['per_request_tok_s'])} tok/s per request, "
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


def _misses(r: Row, constraints: dict[str, float]) -> str:
    """What a point misses: each constraint it breaks, with its value."""
    out = []
    for k, limit in constraints.items():
        col, at_most, text = CONSTRAINTS[k]
        v = r[col]
        if v != v or (v > limit if at_most else v < limit):
            name, unit = COLUMN_NAMES[col]
            shown = "not defined" if v != v else f"{v:,.1f} {unit}"
            out.append(f"{name} {shown} (needs {text.format(limit)})")
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
    across_conditions: bool = False,
    screen: bool = False,
    simulate: int | None = MAX_SIMULATE,
    running_caps: Sequence[int] | None = None,
    chunks: Sequence[int] | None = None,
    expert_parallel: Sequence[bool] | None = None,
    **kwargs: Any,
) -> Search | Searches:
    """The best split and load by `objective` (one of OBJECTIVES) among the points that
    meet the constraints (an overloaded open-loop point never does). Runs
    `sweep(gpus, conc, rate=rate, splits=splits, **kwargs)` unless a sweep `table` is
    given (`kwargs` passed on as given: sweep and build_scenario check each);
    `splits` [(tp, pp), ...] limits it to those splits.

    max-load: per split the largest load (concurrency, or arrival rate with `rate`)
    that qualifies together with every smaller swept load; splits ranked by it.

    A table of several conditions (box, engine, input and output lengths; conditions.py)
    is searched condition by condition: a `Searches`, one `Search` each, a split ranked
    only against the splits of its own condition. `across_conditions`: one best over all
    of them instead, each split named with its condition.

    `screen`: two stages (two_stage.py, docs/search.md): every plan of the space (the
    sweep's lists x `running_caps` x `chunks` (the engine's prefill chunk, SGLang, or
    token budget, vLLM) x `expert_parallel` (off, on)) priced by the steady-state model,
    then the plans whose band reaches the best sure value simulated (at most `simulate`,
    None: all of them) and ranked as a sweep's rows, each with the model's band."""
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
        splits = [(tp, pp) for tp, pp in splits]
    screened = ""
    if table is None and screen:
        table, screened = two_stage(
            gpus,
            objective,
            conc,
            rate,
            splits,
            constraints,
            kwargs,
            simulate=simulate,
            running_caps=running_caps,
            chunks=chunks,
            expert_parallel=expert_parallel,
        )
        splits = None  # the screen kept to them
    else:
        require(
            running_caps is None and chunks is None and expert_parallel is None,
            "running caps, chunks and expert-parallel lists are a two-stage search's (screen=True)",
        )
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
    parts = list(conditions(df))
    if len(parts) == 1:
        return replace(_search_one(df, objective, constraints), screen=screened)
    if across_conditions:
        for cond, part in parts:
            df.loc[part.index, "split"] = part.split + f" [{condition_text(cond)}]"
        return replace(
            _search_one(df, objective, constraints), across=tuple(c for c, _ in parts), screen=screened
        )
    results, failed = [], []
    for cond, part in parts:
        part = part.copy()
        part.attrs = {}  # the skipped scenarios are said once, after every condition
        try:
            results.append(replace(_search_one(part, objective, constraints), condition=cond))
        except UserError as e:
            failed.append(f"[{condition_text(cond)}] {e}")
    if not results:
        raise UserError("; ".join(failed))
    return Searches(tuple(results), tuple(failed), df, screened)


def _require_defined(df: pd.DataFrame, objective: str, constraints: dict[str, float]) -> None:
    """An objective or a bound on a figure that no point of the table defines (per-request
    speed or TPOT where every measured request produced one token) is one line."""
    wanted = [("--objective " + objective, OBJECTIVES[objective][0])]
    wanted += [("--" + k.replace("_", "-"), CONSTRAINTS[k][0]) for k in constraints]
    for option, col in wanted:
        if col in df.columns and col in COLUMN_NAMES and df[col].isna().all():
            name = "per-request decode speed" if col == "per_request_tok_s" else COLUMN_NAMES[col][0]
            raise UserError(
                f"{option}: {name} is not defined at any point of the table: no measured request "
                "produced a second token (a one-token output has no decode; docs/search.md §5)"
            )


def _search_one(df: pd.DataFrame, objective: str, constraints: dict[str, float]) -> Search:
    """The search of one condition's rows (`qualifies` and `load` set). A figure that is
    not defined at a point (per-request speed and TPOT of one-token outputs: an empty
    cell, files.UNDEFINED_OK) neither ranks it nor meets a bound on it; one defined at
    no point at all is refused by name."""
    lc = load_column(df)
    _require_defined(df, objective, constraints)
    col = OBJECTIVES[objective][0]
    ok_mask = df.qualifies & (df[col].notna() if col in df.columns else True)
    ok = df[ok_mask]
    if ok.empty:
        # by position: the table's index is unique, so the row of idxmax's label
        speeds = df.per_request_tok_s.to_numpy()
        quickest = df.iloc[df.ttft_ms_p99.argmin()]
        fastest = ""
        if not np.isnan(speeds).all():
            top = df.iloc[int(np.nanargmax(speeds))]
            fastest = (
                f"; the fastest per request is {top['split']} at {load_text(top, lc)} "
                f"({top['per_request_tok_s']:,.1f} tok/s)"
            )
        raise UserError(
            f"no split and {'arrival rate' if lc == 'rate_rps' else 'concurrency'} meets "
            + " and ".join(constraint_texts(constraints, lc))
            + f"{fastest}; the lowest TTFT p99 is {quickest['split']} at "
            f"{load_text(quickest, lc)} ({quickest['ttft_ms_p99']:,.0f} ms)"
        )
    unqualified = []
    if objective == "max-load":
        best = []
        for _, part in df.groupby(["gpus", "split"], sort=True):
            carried, fail = _carried(part)
            if carried is None:
                assert fail is not None  # no load carried: the smallest one fails
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


__all__ = [
    "COLUMN_NAMES",
    "CONSTRAINTS",
    "OBJECTIVES",
    "Search",
    "Searches",
    "constraint_texts",
    "explain",
    "gpu_ms_per_token",
    "interval_text",
    "load_text",
    "search",
]

"""Sweeps and search: every TP x PP split of a GPU count x every concurrency.

A split is valid when the model fits and shards (`build_scenario` accepts it); the
others are skipped with the reason it gave. Points run in parallel on local
processes, or on a Dask distributed cluster; each point is deterministic for its
seed, so the table is the same however it was run (rows sorted by gpus, tp, pp, conc).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from .atomic import write_atomic
from .errors import UserError, require
from .scenario import build_scenario

DEFAULT_CONC = (1, 2, 4, 8, 16, 32, 64, 128)
RUN_KEYS = ("warmup_requests", "measure_requests", "max_measure_requests", "ci_target")
WALL_COLUMNS = ("sim_wall_s",)   # the only columns that differ between identical runs
KEY_COLUMNS = ["gpus", "tp", "pp", "conc"]

# objective -> (column, larger is better, label)
OBJECTIVES = {
    "throughput": ("output_throughput_tok_s", True, "output tok/s"),
    "throughput-per-gpu": ("output_tok_s_per_gpu", True, "output tok/s per GPU"),
    "per-request": ("per_request_tok_s", True, "per-request tok/s"),
    "ttft": ("ttft_ms_p99", False, "TTFT p99 ms"),
}


def splits(gpus: int) -> list[tuple[int, int]]:
    """Every (tp, pp) with tp x pp = gpus, TP largest first."""
    return [(gpus // pp, pp) for pp in range(1, gpus + 1) if gpus % pp == 0]


def split_name(tp: int, pp: int) -> str:
    return f"TP{tp} x PP{pp}"


# ---- one point -----------------------------------------------------------------------

def run_point(tp: int, pp: int, conc: int, kwargs: dict, run_kwargs: dict) -> dict:
    """One row of the sweep table. Module-level so that worker processes (local or
    Dask) can unpickle it."""
    from .api import simulate
    from .trace import idle_breakdown

    scenario = build_scenario(tp=tp, pp=pp, concurrency=conc, **kwargs)
    sim, r = simulate(scenario, **run_kwargs)
    idle = idle_breakdown(sim, *r.window_s)
    sc = r.scenario
    n = len(idle)
    return {
        "box": sc["box"], "gpu": sc["gpu"], "model": sc["model"], "profile": sc["profile"],
        "engine": sc["engine"]["engine"], "input_len": sc["workload"]["input_len"],
        "output_len": sc["workload"]["output_len"], "seed": sc["workload"]["seed"],
        "gpus": tp * pp, "tp": tp, "pp": pp, "conc": conc, "split": split_name(tp, pp),
        "layers_per_stage": ",".join(map(str, sc["layers_per_stage"])),
        "output_throughput_tok_s": r.output_throughput_tok_s,
        "output_throughput_ci_tok_s": r.output_throughput_ci_tok_s,
        "output_tok_s_per_gpu": r.output_throughput_tok_s / (tp * pp),
        "request_throughput_req_s": r.request_throughput_req_s,
        "per_request_tok_s": r.per_request_tok_s,
        "ttft_ms_p50": r.ttft_ms_p50, "ttft_ms_p99": r.ttft_ms_p99,
        "tpot_ms_p50": r.tpot_ms_p50, "tpot_ms_p99": r.tpot_ms_p99,
        "e2e_ms_mean": r.e2e_ms_mean,
        "compute_share": r.time_shares["compute"],
        "allreduce_share": r.allreduce_share,
        "bubble_fraction": r.bubble_fraction,
        "idle_p2p_share": sum(s.idle_p2p for s in idle) / n,
        "idle_cpu_share": sum(s.idle_cpu for s in idle) / n,
        "idle_bubble_share": sum(s.idle_bubble for s in idle) / n,
        "p2p_share": r.p2p_share, "cpu_share": r.cpu_share,
        "mean_requests_per_microbatch": r.mean_requests_per_microbatch,
        "mean_decode_batch": r.mean_decode_batch,
        "completed_requests": r.completed_requests,
        "sim_events": r.sim_events,
        "sim_wall_s": r.sim_wall_s,
    }


# ---- inputs ----------------------------------------------------------------------------

def parse_ints(text, what: str) -> list[int]:
    """'1,2,4' (or an int, or a list of ints) -> [1, 2, 4]; each >= 1, at least one."""
    if isinstance(text, int) and not isinstance(text, bool):
        values = [text]
    elif isinstance(text, str):
        parts = [p.strip() for p in text.split(",") if p.strip()]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise UserError(f"{what} '{text}' must be comma-separated whole numbers >= 1, e.g. 1,8,32") from None
    else:
        values = list(text)
    require(len(values) > 0, f"{what} is empty; give at least one whole number >= 1, e.g. 1,8,32")
    for v in values:
        require(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                f"{what}: {v!r} is not a whole number >= 1")
    return sorted(set(values))


def parse_number(text, what: str) -> float | None:
    """An optional number >= 0 given on the command line."""
    if text is None:
        return None
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise UserError(f"{what} '{text}' is not a number") from None
    require(v == v and v >= 0, f"{what} must be a number >= 0, got {text}")
    return v


def check_out_path(path, suffixes: tuple[str, ...], what: str) -> Path:
    """An output file: an allowed suffix and an existing directory, checked before any work."""
    out = Path(path)
    require(out.suffix.lower() in suffixes,
            f"{what} file '{out}' must end in {' or '.join(suffixes)}")
    parent = out.parent if str(out.parent) else Path(".")
    require(parent.is_dir(), f"directory '{parent}' of the {what} file does not exist")
    if out.suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UserError("writing Parquet needs pyarrow: pip install 'pipesim[parquet]', or write .csv") from None
    return out


def write_table(df: pd.DataFrame, path) -> Path:
    """A sweep table as .csv or .parquet (by the file's suffix)."""
    out = check_out_path(path, (".csv", ".parquet"), "output")
    if out.suffix.lower() == ".parquet":
        return write_atomic(out, lambda tmp: df.to_parquet(tmp, index=False))
    return write_atomic(out, lambda tmp: df.to_csv(tmp, index=False))


def read_table(path) -> pd.DataFrame:
    """A sweep table written by `write_table` (or `pipesim sweep --out`)."""
    p = Path(path)
    require(p.is_file(), f"sweep file '{p}' does not exist")
    if p.suffix.lower() == ".parquet":
        check_out_path(p, (".parquet",), "sweep")
        df = pd.read_parquet(p)
    else:
        require(p.suffix.lower() == ".csv", f"sweep file '{p}' must end in .csv or .parquet")
        # lengths are specs ("300" or "100:500"), as the sweep wrote them
        df = pd.read_csv(p, dtype={"input_len": str, "output_len": str})
    missing = [c for c in KEY_COLUMNS + ["output_throughput_tok_s", "per_request_tok_s"] if c not in df.columns]
    require(not missing, f"'{p}' is not a pipesim sweep table: no column(s) {', '.join(missing)}")
    return df


# ---- the sweep ---------------------------------------------------------------------------

def _valid_splits(gpu_counts: list[int], conc: int, kwargs: dict) -> tuple[list[tuple[int, int]], list[str]]:
    """Splits build_scenario accepts, and 'TPa x PPb (N GPUs): reason' for the rest.
    A reason every split shares (an unknown model, a bad knob) is not about the split:
    it is raised as is."""
    valid, reasons = [], {}
    for g in gpu_counts:
        for tp, pp in splits(g):
            try:
                build_scenario(tp=tp, pp=pp, concurrency=conc, **kwargs)
                valid.append((tp, pp))
            except UserError as exc:
                reasons[(tp, pp)] = str(exc)
    if not valid:
        distinct = set(reasons.values())
        if len(distinct) == 1 and len(reasons) > 1:
            raise UserError(distinct.pop())
        raise UserError(f"no valid TP x PP split for {', '.join(map(str, gpu_counts))} GPUs: " +
                        "; ".join(f"{split_name(*k)}: {v}" for k, v in reasons.items()))
    skipped = [f"{split_name(tp, pp)} ({tp * pp} GPUs): {why}" for (tp, pp), why in reasons.items()]
    return valid, skipped


def sweep(gpus: int | str | Sequence[int] = 8, conc: int | str | Sequence[int] = DEFAULT_CONC, *,
          scheduler: str | None = None, workers: int | None = None, progress: bool | None = False,
          **kwargs) -> pd.DataFrame:
    """Run every valid (tp, pp) with tp x pp in `gpus` at every closed-loop concurrency
    in `conc`. Keyword arguments are those of `pipesim.predict` (model, profile,
    engine, box, input_len, output_len, seed, engine knobs, warmup_requests, ...).

    `workers`: local processes (default: every core; 1 runs in this process).
    `scheduler`: a Dask scheduler address (tcp://host:port) to run on instead.
    Returns one row per point, sorted by gpus, tp, pp, conc; `df.attrs["skipped"]`
    lists the splits that were left out and why.
    """
    gpu_counts = parse_ints(gpus, "--gpus")
    concs = parse_ints(conc, "--conc")
    for k in ("tp", "pp", "concurrency", "rate_rps", "trace", "num_requests"):
        require(kwargs.pop(k, None) is None, f"a sweep sets tp, pp and the concurrency itself; it takes no {k}")
    run_kwargs = {k: kwargs.pop(k) for k in RUN_KEYS if k in kwargs}
    valid, skipped = _valid_splits(gpu_counts, concs[0], kwargs)
    points = [(tp, pp, c) for tp, pp in valid for c in concs]

    if scheduler:
        rows = _run_dask(scheduler, points, kwargs, run_kwargs, progress)
    else:
        rows = _run_local(points, kwargs, run_kwargs, workers, progress)
    df = pd.DataFrame(rows).sort_values(KEY_COLUMNS, kind="stable").reset_index(drop=True)
    df.attrs["skipped"] = skipped
    return df


def _bar(total: int, progress: bool | None):
    from tqdm import tqdm

    # progress=None: a bar only on a terminal
    return tqdm(total=total, desc="sweep", unit="run", disable=None if progress is None else not progress)


def _run_local(points, kwargs, run_kwargs, workers, progress) -> list[dict]:
    n = min(workers or os.cpu_count() or 1, len(points))
    rows = []
    with _bar(len(points), progress) as bar:
        if n <= 1:
            for tp, pp, c in points:
                rows.append(run_point(tp, pp, c, kwargs, run_kwargs))
                bar.update()
            return rows
        with ProcessPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(run_point, tp, pp, c, kwargs, run_kwargs) for tp, pp, c in points]
            for fut in as_completed(futures):
                rows.append(fut.result())
                bar.update()
    return rows


def _run_dask(address: str, points, kwargs, run_kwargs, progress) -> list[dict]:
    try:
        from dask.distributed import Client
        from dask.distributed import as_completed as dask_completed
    except ImportError:
        raise UserError("--scheduler needs Dask: pip install 'pipesim[cluster]'") from None
    try:
        client = Client(address, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    rows = []
    with client, _bar(len(points), progress) as bar:
        # the scenario inputs (a Profile object can be megabytes) go to each worker once
        [shared] = client.scatter([kwargs], broadcast=True, hash=False)
        futures = [client.submit(run_point, tp, pp, c, shared, run_kwargs, pure=False) for tp, pp, c in points]
        for fut in dask_completed(futures, loop=client.loop):
            rows.append(fut.result())
            bar.update()
    return rows


# ---- summaries ---------------------------------------------------------------------------

def best_by_conc(df: pd.DataFrame, column: str = "output_throughput_tok_s") -> pd.DataFrame:
    """The best split at each (gpus, concurrency) by `column` (larger is better)."""
    idx = df.sort_values(["gpus", "conc", column, "tp"], ascending=[True, True, False, True]) \
            .groupby(["gpus", "conc"], sort=True).head(1).index
    return df.loc[idx].sort_values(["gpus", "conc"]).reset_index(drop=True)


def summary(df: pd.DataFrame) -> str:
    """The human table of a sweep: output tok/s (per-request tok/s) by concurrency and
    split, the best split at each concurrency marked with *."""
    splits_ = df[["gpus", "tp", "pp", "split"]].drop_duplicates().sort_values(["gpus", "tp", "pp"])
    best = {(r.gpus, r.conc): (r.tp, r.pp) for r in best_by_conc(df).itertuples()}
    first = df.iloc[0]
    lines = [f"pipesim sweep  {first['model']} on {first['box']} ({first['profile']}), {first['engine']}, "
             f"in/out {first['input_len']}/{first['output_len']} tokens",
             "output tok/s (per-request tok/s); * = most output tok/s at that concurrency and GPU count", ""]
    width = 20
    header = f"{'GPUs':>4} {'C':>5}  " + "".join(f"{s:>{width}}" for s in splits_.split)
    lines.append(header)
    cells = df.set_index(["gpus", "tp", "pp", "conc"])
    for (g, c), _ in df.groupby(["gpus", "conc"], sort=True):
        row = f"{g:>4} {c:>5}  "
        for sp in splits_.itertuples():
            key = (sp.gpus, sp.tp, sp.pp, c)
            if sp.gpus != g or key not in cells.index:
                row += f"{'':>{width}}"
                continue
            r = cells.loc[key]
            mark = "*" if best.get((g, c)) == (sp.tp, sp.pp) else " "
            row += f"{mark + f'{r.output_throughput_tok_s:,.1f} ({r.per_request_tok_s:,.1f})':>{width}}"
        lines.append(row)
    for s in df.attrs.get("skipped", []):
        lines.append(f"skipped {s}")
    return "\n".join(lines)


# ---- search --------------------------------------------------------------------------------

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


def search(gpus: int | str | Sequence[int] = 8, objective: str = "throughput",
           conc: int | str | Sequence[int] = DEFAULT_CONC, *, min_per_request_tok_s: float | None = None,
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


def gpu_ms_per_token(row) -> dict:
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


def explain(win, runner, objective: str, df: pd.DataFrame) -> str:
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



"""Sweeps: every TP x PP split of a GPU count x every load x every box, engine, input and
output length listed, one row each.

The scenarios are built and checked first (grid.py: invalid ones skipped with their
reason, the total bounded). They run in parallel on local processes, or on a Dask
distributed cluster (workers.py); each is deterministic for its seed, so the table is the
same however it was run (rows sorted by box, engine, lengths, gpus, tp, pp, load). With an
output file each row is written as it finishes and an interrupted sweep resumes where it
stopped (stream.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.checks import MAX_CONCURRENCY, MAX_WORKERS, whole
from ..base.errors import require
from ..base.files import TABLE_SUFFIXES
from ..base.progress import bar as progress_bar
from ..base.writes import cleanup_on_signals, input_paths
from ..inputs.workload import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN
from ..scenario.admission import admission
from ..scenario.build import build_scenario
from .grid import (
    KEY_COLUMNS,
    Grid,
    build_grid,
    choices,
    positive_numbers,
    row_key,
    split_name,
    splits_of,
    whole_numbers,
)

if TYPE_CHECKING:  # pandas is imported where a table is built, so the CLI can read DEFAULT_CONC cheaply
    import pandas as pd

    from ..scenario.build import Scenario

DEFAULT_CONC = (1, 2, 4, 8, 16, 32, 64, 128)
WALL_COLUMNS = ("sim_wall_s",)  # the only columns that differ between identical runs


def load_column(df: pd.DataFrame) -> str:
    """The load a sweep table varies: 'rate_rps' for an open-loop sweep, else 'conc'."""
    return "rate_rps" if "rate_rps" in df.columns and (df.rate_rps > 0).all() else "conc"


splits = splits_of  # every (tp, pp) with tp x pp = gpus, TP largest first
__all__ = ["KEY_COLUMNS", "split_name", "splits", "sweep"]


# ---- one point -----------------------------------------------------------------------


def run_point(
    tp: int,
    pp: int,
    load: float,
    kwargs: dict,
    run_kwargs: dict,
    open_loop: bool = False,
    combo: dict | None = None,
) -> dict:
    """One row of the sweep table: `load` is the closed-loop concurrency, or with
    `open_loop` the Poisson arrival rate (req/s); `combo` the box, engine and lengths
    of this scenario (beside `kwargs`, which all share). Module-level so that worker
    processes (local or Dask) can unpickle it."""
    from .. import api
    from ..measure.metrics import idle_breakdown

    kwargs = {**kwargs, **(combo or {})}

    load_kw = dict(rate_rps=float(load)) if open_loop else dict(concurrency=int(load))
    scenario = build_scenario(tp=tp, pp=pp, **load_kw, **kwargs)
    plan = scenario.plan
    # the band without an extra run (docs/uncertainty.md): the workload part from the
    # run itself (a closed loop's stretches of requests, an open loop's of arrivals)
    rec, r = api.simulate(scenario, intervals="run", **run_kwargs)
    idle = idle_breakdown(rec)
    sc = r.scenario
    eng = sc["engine"]
    n = len(idle)
    sat = r.saturation or {}
    bands = {f"{m}{end}": v for m, band in r.intervals.items() for end, v in zip(("_lo", "_hi"), band)}
    return {
        "box": sc["box"],
        "gpu": sc["gpu"],
        "model": sc["model"],
        "profile": sc["profile"],
        "engine": eng["engine"],
        "input_len": sc["workload"]["input_len"],
        "output_len": sc["workload"]["output_len"],
        "seed": sc["workload"]["seed"],
        "gpus": plan.gpus,
        "tp": tp,
        "pp": pp,
        "dp": plan.dp,
        "dp_attention": plan.dp_attention,
        "conc": 0 if open_loop else int(load),
        "rate_rps": float(load) if open_loop else 0.0,
        "split": split_name(tp, pp, plan.dp, plan.dp_attention) + (f" x EP{plan.ep}" if plan.ep > 1 else ""),
        "ep": plan.ep,
        "layers_per_stage": ",".join(map(str, sc["layers_per_stage"])),
        "output_throughput_tok_s": r.output_throughput_tok_s,
        "output_throughput_ci_tok_s": r.output_throughput_ci_tok_s,
        "output_tok_s_per_gpu": r.output_throughput_tok_s / plan.gpus,
        "request_throughput_req_s": r.request_throughput_req_s,
        "per_request_tok_s": r.per_request_tok_s,
        "ttft_ms_p50": r.ttft_ms_p50,
        "ttft_ms_p99": r.ttft_ms_p99,
        "tpot_ms_p50": r.tpot_ms_p50,
        "tpot_ms_p99": r.tpot_ms_p99,
        "e2e_ms_mean": r.e2e_ms_mean,
        **bands,
        "compute_share": r.time_shares["compute"],
        "allreduce_share": r.allreduce_share,
        "bubble_fraction": r.bubble_fraction,
        "idle_p2p_share": sum(s.idle_p2p for s in idle) / n,
        "idle_cpu_share": sum(s.idle_cpu for s in idle) / n,
        "idle_bubble_share": sum(s.idle_bubble for s in idle) / n,
        "p2p_share": r.p2p_share,
        "cpu_share": r.cpu_share,
        "mean_requests_per_microbatch": r.mean_requests_per_microbatch,
        "mean_decode_batch": r.mean_decode_batch,
        "decode_batch_per_slot": ";".join(f"{b:.3f}" for b in r.decode_batch_per_slot),
        # vLLM's in-flight groups (plot.bubble_cause reads them where present); SGLang: none
        "group_sizes": ";".join(f"{b:.3f}" for b in r.group_sizes) if r.group_sizes else float("nan"),
        **positions(r.occupancy_by_position, r.empty_share_by_position),
        "preemptions": r.preemptions,
        **caps(scenario),
        "overloaded": bool(sat.get("overloaded", False)),
        "served_req_s": sat.get("served_rate_req_s", float("nan")),
        "queue_growth_req_s": sat.get("queue_growth_req_s", float("nan")),
        "completed_requests": r.completed_requests,
        "sim_events": r.sim_events,
        "sim_wall_s": r.sim_wall_s,
    }


def positions(means: list | None, empty: list | None) -> dict:
    """The slots by position (measure/occupancy.py; plot.bubble_cause reads them): each
    one's mean requests and share of time empty, ';'-joined, and the mean number holding
    a batch; NaN without positions (DP ranks)."""
    if means is None or empty is None:
        return dict.fromkeys(
            ("occupancy_by_position", "empty_share_by_position", "batches_in_flight"), math.nan
        )
    return {
        "occupancy_by_position": ";".join(f"{m:.3f}" for m in means),
        "empty_share_by_position": ";".join(f"{e:.4f}" for e in empty),
        "batches_in_flight": sum(1.0 - e for e in empty),
    }


def caps(scenario: Scenario) -> dict:
    """What bounds the requests running at once in a scenario (scenario/admission.py,
    every request at its largest, as it is when it finishes): the engine's running cap
    (SGLang max_running_requests, vLLM max_num_seqs), SGLang's per-slot cap times its
    slots, and the KV cache. `effective_cap` is the smallest: a closed loop with more
    clients than that only queues, so throughput flattens there; `cap_reason` names the
    bound. With DP ranks each has its own caps and KV pool: the bounds are theirs times
    dp (the per-slot cap and KV tokens columns stay one rank's)."""
    s = scenario.settings
    a = admission(scenario.workload, s, scenario.plan.dp, "max")
    return {
        "running_cap": a.running_cap,
        "slot_cap": s.slot_cap,
        "slots": s.slots,
        "kv_cache_tokens": a.kv_tokens,
        "kv_request_cap": a.kv_requests,
        "effective_cap": a.cap,
        "cap_reason": a.reason,
    }


# ---- the sweep ---------------------------------------------------------------------------


def sweep(
    gpus: int | Sequence[int] = 8,
    conc: int | Sequence[int] | None = DEFAULT_CONC,
    *,
    rate: float | Sequence[float] | None = None,
    splits: Sequence[tuple[int, int]] | None = None,
    dp: int | Sequence[int] = 1,
    input_len: str | int | Sequence[str | int] = DEFAULT_INPUT_LEN,
    output_len: str | int | Sequence[str | int] = DEFAULT_OUTPUT_LEN,
    engine: str | Sequence[str] | None = None,
    box: str | Sequence[str] | None = None,
    scheduler: str | None = None,
    workers: int | None = None,
    progress: bool | None = False,
    out: str | Path | None = None,
    resume: bool = False,
    **kwargs: object,
) -> pd.DataFrame:
    """Run every valid (tp, pp) with tp x pp in `gpus` at every closed-loop concurrency
    in `conc`, or, with `rate`, at every open-loop Poisson arrival rate (req/s; `conc`
    is then not read; `num_requests` per point, default 200), for every box, engine,
    input length and output length listed (`input_len`, `output_len`, `engine`, `box`:
    one value or a list; grid.py). `splits` [(tp, pp), ...]: only these (their GPU counts
    are then the ones swept). `dp`: the data-parallel sizes swept (one or a list; each
    dp > 1 a split of pp 1: tp = gpus / dp, or tp = gpus with `dp_attention`; grid.py
    `dp_splits_of`). Other keyword arguments are those of `pipesim.predict` (model,
    profile, seed, engine knobs, dp_attention, enable_expert_parallel, warmup_requests, ...).

    `workers`: local processes (default: every core; 1 runs in this process).
    `scheduler`: a Dask scheduler address (tcp://host:port) to run on instead.
    `out`: a .csv or .parquet file; each row is streamed to `out`.part as it finishes and
    the table written to `out` at the end (stream.py). `resume`: keep the rows already
    there (the part file of an interrupted sweep, or a finished `out`) and run the rest;
    refused if they were written with other options.
    Returns one row per scenario, sorted by box, engine, lengths, gpus, tp, pp, load;
    `df.attrs["skipped"]` lists the scenarios that were left out and why.
    """

    from ..base.files import check_out_path, write_table
    from . import stream
    from .workers import run_tasks

    only = None
    if splits is not None:
        pairs = [tuple(x) for x in splits]
        require(
            len(pairs) > 0
            and all(len(x) == 2 and all(isinstance(v, int) and v >= 1 for v in x) for x in pairs),
            f"splits {splits!r} must be (tp, pp) pairs of whole numbers >= 1, e.g. [(2, 4), (8, 1)]",
        )
        only = [(tp, pp) for tp, pp in pairs]
        gpus = sorted({tp * pp for tp, pp in only})
    gpu_counts = whole_numbers(gpus, "gpus")
    dps = whole_numbers(dp, "dp")
    open_loop = rate is not None
    loads = positive_numbers(rate, "rate") if open_loop else whole_numbers(conc, "conc", MAX_CONCURRENCY)
    for k in ("tp", "pp", "concurrency", "rate_rps", "trace") + (() if open_loop else ("num_requests",)):
        require(kwargs.pop(k, None) is None, f"a sweep sets tp, pp and the load itself; it takes no {k}")
    if open_loop:
        kwargs["num_requests"] = kwargs.get("num_requests") or 200
    if workers is not None:
        workers = whole(workers, "workers", 1, MAX_WORKERS)
    require(not resume or out is not None, "--resume continues the sweep in --out: give --out")
    inputs = input_paths(
        **{k: kwargs.get(k) for k in ("model", "profile", "trace")},
        **{f"box {b}": b for b in ([box] if isinstance(box, str) else box or [])},
    )
    if out is not None:
        check_out_path(out, TABLE_SUFFIXES, "output", inputs)
    from ..api import RUN_KEYS

    run_kwargs = {k: kwargs.pop(k) for k in RUN_KEYS if k in kwargs}
    lists: dict[str, Sequence] = dict(
        box=choices(box, "box"),
        engine=choices(engine, "engine"),
        input_len=choices(input_len, "input length"),
        output_len=choices(output_len, "output length"),
    )
    options = stream.options_text(kwargs, run_kwargs, open_loop)
    # the rows a resume keeps, and its part file held: read and checked, nothing written yet
    done, held = stream.done_rows(out, options, resume) if out is not None else (None, None)
    rows = []
    try:
        grid = build_grid(gpu_counts, loads, open_loop, kwargs, lists, only, dps)
        have = set() if done is None else {row_key(r) for r in done[list(KEY_COLUMNS)].to_dict("records")}
        todo = [p for p in grid.points if p.key not in have]
        tasks = [(p.tp, p.pp, p.load, {**_given(grid.combos[p.combo]), "dp": p.dp}) for p in todo]
        if out is not None and held is None:  # every check passed: the part file is made now
            held = stream.PartFile.open(stream.part_path(out), Path(out), create=True)
        writer = stream.PartWriter(held, done) if held is not None else None
        # SIGTERM stops the sweep as Ctrl-C does: the finished rows stay in the part file
        with cleanup_on_signals():
            # the rows done before start the count; tqdm's rate (so the ETA) counts only this run's
            with progress_bar(
                len(grid.points), "sweep", progress, initial=len(grid.points) - len(todo), leave=True
            ) as bar:
                for row in run_tasks(run_point, tasks, kwargs, run_kwargs, open_loop, workers, scheduler):
                    row[stream.OPTIONS_COLUMN] = options
                    if writer is not None:
                        writer.write(row)
                    rows.append(row)
                    bar.update()
            df = _joined(rows, done, grid)
            if out is not None:
                assert held is not None
                write_table(df, out, inputs)  # while the part file is held: no other sweep writes OUT
                held.finish()
    finally:
        if held is not None:
            held.close()
    return df


def _joined(rows: list[dict], done: pd.DataFrame | None, grid: Grid) -> pd.DataFrame:
    """The sweep's table: the rows a resume kept, then this run's, in table order."""
    import pandas as pd

    new = pd.DataFrame(rows)
    if done is None or not len(done):
        df = new
    else:  # the rows read back, then this run's (each typed as the file's reader types it)
        df = pd.concat([done, new], ignore_index=True) if len(new) else done
    df = sort_table(df)
    df.attrs["skipped"] = list(grid.skipped)
    df.attrs["kept"] = len(df) - len(new)  # rows a resume found in the file
    return df


def _given(combo: dict) -> dict:
    """The box, engine and lengths a scenario was given (the defaults left out)."""
    return {k: v for k, v in combo.items() if v is not None}


def sort_table(df: pd.DataFrame) -> pd.DataFrame:
    """A sweep table in its order: box, engine, input and output lengths (by tokens), gpus,
    tp, pp, conc, rate_rps."""
    tokens = lambda col: col.map(lambda spec: tuple(int(x) for x in str(spec).split(":")))  # noqa: E731
    return df.sort_values(
        list(KEY_COLUMNS),
        key=lambda col: tokens(col) if col.name in ("input_len", "output_len") else col,
        kind="stable",
    ).reset_index(drop=True)


# ---- summaries ---------------------------------------------------------------------------


def with_split_columns(df: pd.DataFrame) -> pd.DataFrame:
    """A sweep table with its split columns: a table written before data parallelism has
    no dp / dp_attention columns, its rows are dp 1."""
    if "dp" in df.columns:
        return df
    return df.assign(dp=1, dp_attention=False)


def best_by_conc(df: pd.DataFrame, column: str = "output_throughput_tok_s") -> pd.DataFrame:
    """The best split at each (condition, gpus, load) by `column` (larger is better): a
    condition is the box, engine and lengths of a row (conditions.py), so a split is only
    ever compared with the splits of its own; the load is the concurrency, or the arrival
    rate of an open-loop sweep (`load_column`). Rows in table order of the conditions."""
    from .conditions import condition_index

    lc = load_column(df)
    df = df.assign(_condition=condition_index(df))
    keys = ["_condition", "gpus", lc]
    idx = (
        df.sort_values([*keys, column, "tp"], ascending=[True, True, True, False, True])
        .groupby(keys, sort=True)
        .head(1)
        .index
    )
    return df.loc[idx].sort_values(keys).drop(columns="_condition").reset_index(drop=True)


def summary(df: pd.DataFrame) -> str:
    """The human table of a sweep: output tok/s (per-request tok/s) by concurrency and
    split, the best split at each concurrency marked with *; in an open-loop sweep
    (by arrival rate) an overloaded point is marked with ! (saturation.py). One table per
    condition (box, engine and lengths swept), headed by what tells it apart."""
    from .bands import footer
    from .conditions import condition_text, conditions, varying

    parts = list(conditions(df))
    skipped = "\n".join(f"skipped {s}" for s in df.attrs.get("skipped", []))
    keys = [*varying(df), "gpus", load_column(df)]
    bands = "\n".join(footer(df, keys))
    if len(parts) == 1:
        return "\n\n".join([_block(df), bands, skipped]).rstrip()
    lines = _heading(df, varying(df))
    lines[-1] = f"{len(parts)} conditions, one table each"
    blocks = ["\n".join(lines)]
    blocks += [f"[{condition_text(c)}]\n" + "\n".join(_table(part)) for c, part in parts]
    return "\n\n".join([*blocks, bands, skipped]).rstrip()


def _heading(df: pd.DataFrame, varying: Sequence[str] = ()) -> list[str]:
    """The sweep's model, box, profile, engine and lengths (those in `varying` listed),
    what the cells hold, and a blank line."""
    lc = load_column(df)
    first = df.iloc[0]
    val = lambda c: ", ".join(dict.fromkeys(map(str, df[c]))) if c in varying else first.get(c, "?")  # noqa: E731
    what = "arrival rate" if lc == "rate_rps" else "concurrency"
    lengths = "input_len" in df.columns and "output_len" in df.columns  # a table from before they were
    return [
        f"pipesim sweep  {first['model']} on {val('box')} ({first['profile']}), {val('engine')}"
        + (f", in/out {val('input_len')}/{val('output_len')} tokens" if lengths else ""),
        f"output tok/s (per-request tok/s); * = most output tok/s at that {what} and GPU count"
        + ("; ! = overloaded (the queue grows)" if lc == "rate_rps" else ""),
        "",
    ]


def _block(df: pd.DataFrame) -> str:
    return "\n".join(_heading(df) + _table(df))


def _table(df: pd.DataFrame) -> list[str]:
    """One condition's table: a row per (gpus, load), a column per split."""
    lc = load_column(df)
    df = with_split_columns(df)
    splits_ = (
        df[["gpus", "tp", "pp", "dp", "split"]].drop_duplicates().sort_values(["gpus", "dp", "tp", "pp"])
    )
    best: dict[tuple, object] = {(r.gpus, getattr(r, lc)): r.split for r in best_by_conc(df).itertuples()}
    width = max(20, 2 + max(len(s) for s in splits_.split))
    header = f"{'GPUs':>4} {'req/s' if lc == 'rate_rps' else 'C':>5}  " + "".join(
        f"{s:>{width}}" for s in splits_.split
    )
    lines = [header]
    cells = df.set_index(["gpus", "split", lc])
    for (g, c), _ in df.groupby(["gpus", lc], sort=True):
        row = f"{g:>4} {c:>5g}  "
        for sp in splits_.itertuples():
            key = (sp.gpus, sp.split, c)
            if sp.gpus != g or key not in cells.index:
                row += f"{'':>{width}}"
                continue
            r = cells.loc[key]
            mark = "*" if best.get((g, c)) == sp.split else " "
            if lc == "rate_rps" and bool(r.get("overloaded", False)):
                mark = "!" + mark.strip()
            speed = "-" if r.per_request_tok_s != r.per_request_tok_s else f"{r.per_request_tok_s:,.1f}"
            row += f"{mark + f'{r.output_throughput_tok_s:,.1f} ({speed})':>{width}}"
        lines.append(row)
    return lines

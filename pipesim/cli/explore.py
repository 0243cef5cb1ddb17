"""Many scenarios: `pipesim sweep`, `pipesim search` and `pipesim plot`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import click

from ..base.checks import MAX_BATCH_TOKENS, MAX_CONCURRENCY, MAX_RUNNING, MAX_SIMULATE, MAX_SWEEP_SCENARIOS
from ..base.errors import require
from .help import GroupedCommand
from .options import (
    DEFAULT_CONC_TEXT,
    apply_options,
    list_kwargs,
    parallel_grid_kwargs,
    parallel_grid_options,
    parse_floats,
    parse_ints,
    parse_list,
    parse_number,
    parse_splits,
    parse_workers,
    scenario_kwargs,
    sweep_scenario_options,
)


def load_grid_options(gpus_help: str, conc_help: str, rate_help: str) -> Callable[[Callable], Callable]:
    """The GPU counts, splits and loads that sweep and search both grid over (the help of
    --gpus, --conc and --rate worded for each command)."""

    def decorate(f: Callable) -> Callable:
        options = [
            click.option("--gpus", default="8", show_default=True, metavar="N[,N..]", help=gpus_help),
            click.option(
                "--splits",
                default=None,
                metavar="TPxPP[,..]",
                help="only these splits, e.g. 2x4,8x1 (sets the GPU counts)",
            ),
            click.option(
                "--conc", "--max-concurrency", "conc", default=None, metavar="C[,C..]", help=conc_help
            ),
            click.option("--rate", "--request-rate", "rate", default=None, metavar="R[,R..]", help=rate_help),
            click.option(
                "--num-requests", type=int, default=None, help="requests per point with --rate [default: 200]"
            ),
        ]
        return apply_options(f, options)

    return decorate


class LoadKeywords(TypedDict, total=False):
    """The sweep's keywords for its loads (`load_kwargs`)."""

    conc: list[int]
    rate: list[float]
    num_requests: int


def load_kwargs(conc: str | None, rate: str | None, num_requests: int | None) -> LoadKeywords:
    """The sweep's keywords for the loads: the concurrencies (the default list when none is
    given) and, with --rate, the arrival rates and the requests per point (0 or unset: the
    sweep's 200)."""
    load = LoadKeywords(
        conc=parse_ints(DEFAULT_CONC_TEXT if conc is None else conc, "--conc", MAX_CONCURRENCY)
    )
    if rate is not None:
        load["rate"] = parse_floats(rate, "--rate")
        if num_requests:
            load["num_requests"] = num_requests
    return load


def workers_options(workers_help: str, scheduler_help: str) -> Callable[[Callable], Callable]:
    """Where sweep and search run their points: local workers or a Dask cluster, and the
    progress bar (the help of --workers and --scheduler worded for each command)."""

    def decorate(f: Callable) -> Callable:
        f = click.option(
            "--progress/--no-progress", default=None, help="progress bar [default: on a terminal]"
        )(f)
        f = click.option("--scheduler", default=None, help=scheduler_help)(f)
        return click.option("--workers", type=int, default=None, help=workers_help)(f)

    return decorate


def two_stage_options(f: Callable) -> Callable:
    """A search's two stages (docs/search.md): what the model screens, what is simulated."""
    options = [
        click.option(
            "--simulate-all",
            is_flag=True,
            help="simulate every plan (a sweep), as before the steady-state model screened them",
        ),
        click.option(
            "--simulate",
            default=str(MAX_SIMULATE),
            show_default=True,
            metavar="N|band",
            help="simulate the plans whose model band reaches the best's, at most N (the best by the model "
            "first); band: every one of them",
        ),
        click.option(
            "--running-caps",
            default=None,
            metavar="N[,N..]",
            help="running caps to try (SGLang --max-running-requests, vLLM --max-num-seqs) [default: the engine's]",
        ),
        click.option(
            "--chunks",
            default=None,
            metavar="N[,N..]",
            help="prefill chunks to try (SGLang --chunked-prefill-size, vLLM --max-num-batched-tokens) "
            "[default: the engine's]",
        ),
        click.option(
            "--expert-parallel",
            default=None,
            metavar="off,on",
            help="try each split without and with expert parallel (off, on or off,on) [default: --enable-expert-parallel]",
        ),
    ]
    return apply_options(f, options)


def two_stage_kwargs(
    simulate_all: bool,
    simulate: str,
    running_caps: str | None,
    chunks: str | None,
    expert_parallel: str | None,
) -> dict:
    """The search's keywords for its two stages (search.search: screen, simulate, ...)."""
    if simulate_all:
        require(
            not (running_caps or chunks or expert_parallel),
            "--running-caps, --chunks and --expert-parallel are a two-stage search's; --simulate-all sweeps "
            "the engine's own knobs (give them as --max-running-requests ...)",
        )
        return {}
    if simulate.strip().lower() == "band":
        keep = None
    else:
        keep = parse_ints(simulate, "--simulate", MAX_SWEEP_SCENARIOS)[0]
    modes = None
    if expert_parallel is not None:
        parts = parse_list(expert_parallel, "--expert-parallel")
        require(
            all(p in ("off", "on") for p in parts),
            f"--expert-parallel '{expert_parallel}': allowed off, on or off,on",
        )
        modes = [p == "on" for p in parts]
    return dict(
        screen=True,
        simulate=keep,
        running_caps=parse_ints(running_caps, "--running-caps", MAX_RUNNING) if running_caps else None,
        chunks=parse_ints(chunks, "--chunks", MAX_BATCH_TOKENS) if chunks else None,
        expert_parallel=modes,
    )


@click.command(cls=GroupedCommand)
@load_grid_options(
    gpus_help="GPU count, or several: 2,4,8 (every tp x pp = count)",
    conc_help=f"concurrencies, comma-separated [default: {DEFAULT_CONC_TEXT}]",
    rate_help="open-loop Poisson arrival rates (req/s) instead of concurrencies",
)
@parallel_grid_options
@sweep_scenario_options
@click.option(
    "--out",
    default=None,
    help="write the table to this .csv or .parquet file (each row to OUT.part as it finishes)",
)
@click.option(
    "--resume",
    is_flag=True,
    default=False,
    help="finish the sweep in --out: run only the scenarios not in it (refused if its options differ)",
)
@click.option(
    "--json", "as_json", is_flag=True, help="print the rows as one JSON object instead of the summary"
)
@workers_options(
    workers_help="local worker processes [default: every core; 1: in this process]",
    scheduler_help="run on a Dask cluster: its scheduler address, tcp://HOST:PORT",
)
def sweep(
    gpus: str,
    splits: str | None,
    dp: str,
    enable_dp_attention: bool,
    enable_expert_parallel: bool,
    conc: str | None,
    rate: str | None,
    num_requests: int | None,
    out: str | None,
    resume: bool,
    as_json: bool,
    workers: int | None,
    scheduler: str | None,
    progress: bool | None,
    **opts: object,
) -> None:
    """Every valid TP x PP split for the GPU count(s) x every load x every engine, box and
    length listed: a table."""
    import time

    from ..explore.stream import part_path
    from ..explore.sweep import summary
    from ..explore.sweep import sweep as run_sweep

    require(conc is None or rate is None, "give --conc or --rate, not both")
    load = load_kwargs(conc, rate, num_requests)
    t = time.perf_counter()
    try:
        df = run_sweep(
            parse_ints(gpus, "--gpus"),
            splits=parse_splits(splits),
            **parallel_grid_kwargs(dp, enable_dp_attention, enable_expert_parallel),
            scheduler=scheduler,
            workers=parse_workers(workers),
            progress=progress,
            out=out,
            resume=resume,
            **load,
            **list_kwargs(scenario_kwargs(opts)),
        )
    except KeyboardInterrupt:
        part = part_path(out) if out is not None else None
        if part is not None and part.is_file():
            rows = max(0, part.read_bytes().count(b"\n") - 1)
            click.echo(
                f"\npipesim: {rows} finished rows are in {part}; add --resume to finish the sweep", err=True
            )
        raise
    wall_s = time.perf_counter() - t
    if as_json:
        from ..base.jsonout import dumps

        skipped = list(df.attrs.get("skipped", []))
        click.echo(dumps({"rows": df, "skipped": skipped, "wall_s": wall_s, **({"out": out} if out else {})}))
        return
    click.echo(summary(df))
    kept = df.attrs.get("kept", 0)
    click.echo(
        f"{len(df)} points in {wall_s:.1f} s"
        + (f" on {scheduler}" if scheduler else "")
        + (f" ({kept} kept from the file, {len(df) - kept} run)" if kept else "")
    )
    if out is not None:
        click.echo(f"wrote {out}")


@click.command(cls=GroupedCommand)
@load_grid_options(
    gpus_help="GPU count, or several: 2,4,8",
    conc_help=f"concurrencies to try [default: {DEFAULT_CONC_TEXT}]",
    rate_help="open-loop Poisson arrival rates (req/s) to try instead of concurrencies",
)
@click.option(
    "--objective",
    default="throughput",
    show_default=True,
    metavar="NAME",
    help="throughput | throughput-per-gpu | max-load (the most load each split carries under the "
    "constraints) | per-request | ttft | fewest-gpus",
)
@click.option(
    "--min-per-request-tok-s",
    default=None,
    metavar="TOK_S",
    help="keep points whose requests decode at least this fast",
)
@click.option(
    "--max-ttft-p50-ms", default=None, metavar="MS", help="keep points whose TTFT p50 is at most this"
)
@click.option(
    "--max-ttft-p99-ms", default=None, metavar="MS", help="keep points whose TTFT p99 is at most this"
)
@click.option(
    "--max-tpot-p50-ms", default=None, metavar="MS", help="keep points whose TPOT p50 is at most this"
)
@click.option(
    "--max-tpot-p99-ms", default=None, metavar="MS", help="keep points whose TPOT p99 is at most this"
)
@click.option(
    "--plot",
    "plot_file",
    default=None,
    metavar="FILE",
    help="also draw the trade-off (.png/.svg): every point, the Pareto frontier, the constraint lines",
)
@click.option(
    "--from", "from_file", default=None, help="search a sweep table (.csv/.parquet) instead of running one"
)
@click.option(
    "--across-conditions",
    is_flag=True,
    help="a table of several boxes, engines or lengths: one best over all of them, not one per condition",
)
@click.option(
    "--json", "as_json", is_flag=True, help="print the answer as one JSON object instead of the text"
)
@two_stage_options
@parallel_grid_options
@sweep_scenario_options
@workers_options(
    workers_help="local worker processes [default: every core]",
    scheduler_help="run on a Dask cluster: tcp://HOST:PORT",
)
def search(
    gpus: str,
    splits: str | None,
    dp: str,
    enable_dp_attention: bool,
    enable_expert_parallel: bool,
    conc: str | None,
    rate: str | None,
    num_requests: int | None,
    objective: str,
    min_per_request_tok_s: str | None,
    max_ttft_p50_ms: str | None,
    max_ttft_p99_ms: str | None,
    max_tpot_p50_ms: str | None,
    max_tpot_p99_ms: str | None,
    plot_file: str | None,
    from_file: str | None,
    across_conditions: bool,
    as_json: bool,
    simulate_all: bool,
    simulate: str,
    running_caps: str | None,
    chunks: str | None,
    expert_parallel: str | None,
    workers: int | None,
    scheduler: str | None,
    progress: bool | None,
    **opts: object,
) -> None:
    """The best split and load under constraints, the alternatives ranked, and why: every
    plan priced by the steady-state model, the ones worth it simulated (docs/search.md)."""
    from pathlib import Path

    from ..base.files import read_table
    from ..explore.search import search as run_search

    require(conc is None or rate is None, "give --conc or --rate, not both")
    if plot_file is not None:
        require(
            Path(plot_file).suffix.lower() in (".png", ".svg"),
            f"figure file '{plot_file}' must end in .png or .svg",
        )
    table = read_table(from_file) if from_file else None
    # option values passed on as given: search checks each
    limits: dict[str, Any] = {
        k: parse_number(v, "--" + k.replace("_", "-"))
        for k, v in dict(
            min_per_request_tok_s=min_per_request_tok_s,
            max_ttft_p50_ms=max_ttft_p50_ms,
            max_ttft_p99_ms=max_ttft_p99_ms,
            max_tpot_p50_ms=max_tpot_p50_ms,
            max_tpot_p99_ms=max_tpot_p99_ms,
        ).items()
    }
    run: dict[str, Any] = {}
    if table is None:  # a table given: nothing is swept, and --gpus/--conc/--rate go unread
        run.update(load_kwargs(conc, rate, num_requests))
        run.update(
            scheduler=scheduler,
            workers=parse_workers(workers),
            progress=progress,
            **list_kwargs(scenario_kwargs(opts)),
        )
        run.update(parallel_grid_kwargs(dp, enable_dp_attention, enable_expert_parallel))
        run.update(two_stage_kwargs(simulate_all, simulate, running_caps, chunks, expert_parallel))
        run["gpus"] = parse_ints(gpus, "--gpus")
    else:
        require(
            not (running_caps or chunks or expert_parallel),
            "--running-caps, --chunks and --expert-parallel set a two-stage search's plans; "
            "a table given with --from is searched as it is",
        )
    result = run_search(
        objective=objective,
        splits=parse_splits(splits),
        table=table,
        across_conditions=across_conditions,
        **limits,
        **run,
    )
    if plot_file is not None:
        from ..explore import plot as pl

        pl.save(pl.pareto(result), plot_file)
    if as_json:
        from ..base.jsonout import dumps

        click.echo(dumps({**result.to_dict(), **({"plot": plot_file} if plot_file else {})}))
        return
    click.echo(result.text())
    if plot_file is not None:
        click.echo(f"wrote {plot_file}")


@click.command()
@click.argument("results")
@click.option("--out-dir", default=".", show_default=True, help="folder for the figures")
@click.option("--format", "fmt", default="png", show_default=True, help="png or svg")
@click.option("--prefix", default="", help="prefix of the file names")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="progress bar with ETA on stderr once drawing has taken 2 s [default: on a terminal]",
)
def plot(results: str, out_dir: str, fmt: str, prefix: str, progress: bool | None) -> None:
    """Figures of a sweep table: throughput vs concurrency, the trade-off curve, the time breakdown."""
    from ..base.files import ensure_dir, read_table
    from ..explore import plot as pl

    ensure_dir(out_dir, "figure")  # before reading: a folder that cannot be made fails first
    for path in pl.save_all(read_table(results), out_dir, fmt, prefix, progress=progress):
        click.echo(f"wrote {path}")

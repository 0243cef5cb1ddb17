"""One scenario: `pipesim predict` and `pipesim trace`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from ..base.errors import require
from .help import GroupedCommand
from .options import (
    apply_options,
    parallel_kwargs,
    parallel_options,
    parse_layers,
    scenario_kwargs,
    scenario_options,
)


def split_options(tp_help: str, pp_help: str, conc_help: str) -> Callable[[Callable], Callable]:
    """--tp, --pp and --conc of one scenario, with the engines' names (the help worded for
    each command)."""

    def decorate(f: Callable) -> Callable:
        options = [
            click.option(
                "--tp",
                "-tp",
                "--tensor-parallel-size",
                "--tp-size",
                "tp",
                type=int,
                default=1,
                show_default=True,
                help=tp_help,
            ),
            click.option(
                "--pp",
                "-pp",
                "--pipeline-parallel-size",
                "--pp-size",
                "pp",
                type=int,
                default=1,
                show_default=True,
                help=pp_help,
            ),
            click.option("--conc", "--max-concurrency", "conc", type=int, default=None, help=conc_help),
        ]
        return apply_options(f, options)

    return decorate


def scenario_inputs(opts: dict, **more: object) -> dict[str, Path]:
    """The files a scenario's flags name (a model config, a box, a trace): what an
    output of the command must not be written over (writes.check_target)."""
    from ..base.writes import input_paths

    return input_paths(
        **{f"--{k}": opts.get(k) for k in ("model", "box", "profile")},
        **{f"--{k}": v for k, v in more.items()},
    )


def scenario_keywords(opts: dict) -> dict:
    """The parallel and scenario flags (`parallel_options`, `scenario_options`) as
    `build_scenario` keywords, popped from `opts`."""
    return {**parallel_kwargs(opts), **scenario_kwargs(opts)}


@click.command(cls=GroupedCommand)
@split_options(
    tp_help="tensor-parallel size (GPUs per stage)",
    pp_help="pipeline-parallel size (stages)",
    conc_help="closed-loop concurrency C (clients); one of --conc, --rate, --trace is needed",
)
@click.option(
    "--rate",
    "--request-rate",
    "rate",
    type=float,
    default=None,
    help="open-loop Poisson arrival rate, requests/s (instead of --conc)",
)
@click.option("--num-requests", type=int, default=None, help="requests to send with --rate or from --trace")
@click.option(
    "--trace",
    type=click.Path(dir_okay=False),
    default=None,
    help="replay a CSV: arrival_s,input_tokens,output_tokens (or Vidur's arrived_at,num_prefill_tokens,num_decode_tokens)",
)
@click.option("--layers", default=None, help="explicit layers per stage, e.g. 7,7,7,8,8,8,8,8")
@parallel_options
@scenario_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the table")
@click.option(
    "--intervals/--no-intervals",
    default=True,
    show_default=True,
    help="prediction intervals (docs/uncertainty.md), no extra run",
)
@click.option(
    "--ensemble",
    is_flag=True,
    help="intervals: the workload part from 4 short runs more (seeds, widened lengths, front-end cost)",
)
@click.option(
    "--sensitivity", is_flag=True, help="a tornado: which parameters and workload assumptions move the answer"
)
@click.option(
    "--step", type=float, default=0.2, show_default=True, help="--sensitivity: relative step of each item"
)
@click.option(
    "--jobs",
    type=int,
    default=None,
    help="--sensitivity: processes to spread its runs over [default: the CPUs, at most 4]",
)
@click.option(
    "--cache/--no-cache",
    default=True,
    show_default=True,
    help="--sensitivity: keep each run's figures, so a run whose scenario and pipesim did not change "
    "is not simulated again (PIPESIM_CACHE_DIR, default ~/.cache/pipesim)",
)
@click.option(
    "--plot",
    "plot_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="--sensitivity: write the tornado figure here (.png, .pdf, .svg)",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="progress bar with ETA on stderr once the work has taken 2 s [default: on a terminal]",
)
def predict(
    tp: int,
    pp: int,
    conc: int | None,
    rate: float | None,
    num_requests: int | None,
    trace: str | None,
    layers: str | None,
    as_json: bool,
    intervals: bool,
    ensemble: bool,
    sensitivity: bool,
    step: float,
    jobs: int | None,
    cache: bool,
    plot_file: str | None,
    progress: bool | None,
    **opts: object,
) -> None:
    """Predict one scenario (default: Kimi K2.6 with SGLang on 8 x RTX PRO 6000)."""
    from .. import api
    from ..report import table as report
    from ..scenario.build import build_scenario

    require(
        plot_file is None or sensitivity, "--plot draws the sensitivity tornado: give --sensitivity with it"
    )
    require(
        not ensemble or intervals, "--ensemble estimates the intervals: drop --no-intervals or --ensemble"
    )
    if plot_file:
        from ..base.files import check_out_path

        check_out_path(plot_file, (".png", ".pdf", ".svg"), "figure", scenario_inputs(opts, trace=trace))
    scenario = build_scenario(
        tp=tp,
        pp=pp,
        concurrency=conc,
        rate_rps=rate,
        num_requests=num_requests,
        trace=trace,
        layers=parse_layers(layers),
        **scenario_keywords(opts),
    )
    if sensitivity:
        from ..base.checks import whole
        from ..base.files import json_text
        from ..base.pool import default_jobs
        from ..base.progress import bar
        from ..report.sensitivity import plot, runs

        n = default_jobs() if jobs is None else whole(jobs, "--jobs", 1, 64)
        with bar(len(runs(scenario, step)), "sensitivity", None) as b:
            sens = api.sensitivity(scenario, step, jobs=n, cache=cache, on_run=b.update)
        if plot_file:
            plot(sens, plot_file)
        click.echo(json_text(sens.to_dict(), indent=2) if as_json else sens.table())
        return
    result = api.run(
        scenario, intervals=("ensemble" if ensemble else "run") if intervals else None, progress=progress
    )
    click.echo(report.to_json(result) if as_json else report.table(result))


@click.command(cls=GroupedCommand)
@split_options(
    tp_help="tensor-parallel size",
    pp_help="pipeline-parallel size",
    conc_help="closed-loop concurrency C (needed)",
)
@parallel_options
@scenario_options
@click.option("--out", default="trace.json", show_default=True, help="the Chrome trace event file (.json)")
def trace(tp: int, pp: int, conc: int | None, out: str, **opts: object) -> None:
    """A Chrome / Perfetto trace of one run: a track per GPU and per PP hop."""
    from .. import api
    from ..base.files import check_out_path
    from ..report.trace import write_trace

    check_out_path(out, (".json",), "trace", scenario_inputs(opts))
    obj, result = api.trace(tp, pp, conc, **scenario_keywords(opts))
    write_trace(out, obj)
    meta = obj["otherData"]
    slices = sum(1 for e in obj["traceEvents"] if e["ph"] == "X")
    click.echo(
        f"wrote {out}: {slices:,} slices over {meta['run_ms'] / 1e3:,.2f} s simulated "
        f"(measured window {meta['window_ms'][0] / 1e3:,.2f}-{meta['window_ms'][1] / 1e3:,.2f} s); "
        "open it in https://ui.perfetto.dev"
    )
    click.echo(
        f"output {result.output_throughput_tok_s:,.1f} tok/s, bubble {result.bubble_fraction:.0%} of GPU time"
    )
    for st in meta["stages"]:
        click.echo(
            f"  stage {st['stage']} (GPU {','.join(map(str, st['gpus']))}): {st['bubbles']:,} bubbles, "
            f"{st['bubble_ms']:,.1f} ms idle ({st['idle_share']:.0%}: P2P wait {st['idle_p2p_share']:.0%}, "
            f"CPU wait {st['idle_cpu_share']:.0%}, pipeline bubble {st['idle_bubble_share']:.0%})"
        )

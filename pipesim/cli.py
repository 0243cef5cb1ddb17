"""The `pipesim` command line. Bad input: one line on stderr, exit code 2."""

from __future__ import annotations

import math
import sys

import click

from .checks import MAX_CONCURRENCY, MAX_GPUS, MAX_WORKERS, number, whole
from .errors import UserError, require
from .scenario import DEFAULT_MODEL, DEFAULT_PROFILE
from .sweep import DEFAULT_CONC
from .workload import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN

EXIT_BAD_INPUT = 2
DEFAULT_CONC_TEXT = ",".join(map(str, DEFAULT_CONC))


def _layers(value: str | None):
    if value is None:
        return None
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise UserError(
            f"--layers '{value}' must be comma-separated whole numbers, e.g. 7,7,7,8,8,8,8,8"
        ) from None


def parse_ints(text: str, what: str, limit: int = MAX_GPUS) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; each from 1 to `limit`, at least one (the sweep checks them again)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise UserError(f"{what} '{text}' must be comma-separated whole numbers >= 1, e.g. 1,8,32") from None
    require(len(values) > 0, f"{what} is empty; give at least one whole number >= 1, e.g. 1,8,32")
    for v in values:
        require(v >= 1, f"{what}: {v!r} is not a whole number >= 1")
        require(v <= limit, f"{what}: {v} is above the limit of {limit}")
    return sorted(set(values))


def parse_floats(text: str, what: str) -> list[float]:
    """'0.5,1,2' -> [0.5, 1.0, 2.0]; each a finite number > 0, at least one."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise UserError(f"{what} '{text}' must be comma-separated numbers > 0, e.g. 0.5,1,2") from None
    require(len(values) > 0, f"{what} is empty; give at least one number > 0, e.g. 0.5,1,2")
    for v in values:
        require(0 < v < float("inf"), f"{what}: {v:g} is not a number > 0")
    return sorted(set(values))


def parse_splits(text: str | None) -> list[tuple[int, int]] | None:
    """'2x4,8x1' -> [(2, 4), (8, 1)] (TP x PP)."""
    if text is None:
        return None
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            tp, pp = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise UserError(
                f"--splits '{text}': '{part}' is not TPxPP; allowed: comma-separated TPxPP with whole "
                "numbers >= 1, e.g. 2x4,8x1"
            ) from None
        require(tp >= 1 and pp >= 1, f"--splits '{text}': '{part}' needs TP >= 1 and PP >= 1")
        out.append((tp, pp))
    require(len(out) > 0, "--splits is empty; give TPxPP pairs, e.g. 2x4,8x1")
    return sorted(set(out))


def parse_number(text: str | None, what: str) -> float | None:
    """An optional number >= 0 given on the command line."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"{what} '{text}' is not a number") from None
    require(math.isfinite(v) and v >= 0, f"{what} must be a finite number >= 0, got {text}")
    return v


def parse_workers(workers: int | None) -> int | None:
    """--workers: unset (every core) or a whole number from 1 to MAX_WORKERS."""
    return None if workers is None else whole(workers, "--workers", 1, MAX_WORKERS)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipesim")
def cli():
    """pipesim: predict throughput and latency of an LLM inference engine for any
    TP x PP split and concurrency, and show where the time goes."""


def scenario_options(f):
    """The scenario and engine flags every simulating command shares."""
    options = [
        click.option(
            "--model",
            default=None,
            help=f"preset name or path of a Hugging Face config.json (the profile's if it names one) [default: {DEFAULT_MODEL}]",
        ),
        click.option(
            "--profile",
            default=None,
            help=f"calibration profile name or directory (with --box: the box's own, see docs/boxes.md) [default: {DEFAULT_PROFILE}]",
        ),
        click.option(
            "--engine",
            type=click.Choice(["sglang", "vllm"]),
            default=None,
            help="engine [default: the profile's]",
        ),
        click.option(
            "--engine-version",
            default=None,
            help="with --box and no --profile: the engine version of the measured tables [default: the newest]",
        ),
        click.option(
            "--allow-foreign-profile",
            is_flag=True,
            default=False,
            help="run a profile measured on another box, GPU or engine (its costs reported as borrowed)",
        ),
        click.option("--box", default=None, help="box preset or .toml [default: the profile's]"),
        click.option(
            "--nodes",
            type=int,
            default=1,
            show_default=True,
            help="a cluster of this many identical boxes (GPUs numbered node-major)",
        ),
        click.option(
            "--network",
            default=None,
            help="what joins the nodes: ib-ndr-400, roce-200, eth-100, ... [default: the box's [network]]",
        ),
        click.option(
            "--kv-cache-dtype",
            default=None,
            help="KV-cache dtype, as the engines name it: auto (the model's 16-bit dtype), bf16, fp16, "
            "fp8, fp8_e4m3, fp8_e5m2 [default: auto]",
        ),
        click.option(
            "--input-len",
            default=DEFAULT_INPUT_LEN,
            show_default=True,
            help="prompt tokens: N or LO:HI (uniform)",
        ),
        click.option(
            "--output-len",
            default=DEFAULT_OUTPUT_LEN,
            show_default=True,
            help="output tokens: N or LO:HI (uniform)",
        ),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="random seed, a whole number >= 0"
        ),
        click.option("--max-running-requests", type=int, default=None, help="SGLang: total running requests"),
        click.option(
            "--pp-max-micro-batch-size",
            type=int,
            default=None,
            help="SGLang: per-slot cap [default: max-running-requests // pp]",
        ),
        click.option(
            "--pp-async-batch-depth",
            type=int,
            default=None,
            help="SGLang: extra micro-batch slots [default 0]",
        ),
        click.option(
            "--chunked-prefill-size",
            type=int,
            default=None,
            help="SGLang: prefill chunk tokens [default by GPU memory]",
        ),
        click.option(
            "--disable-cuda-graph", is_flag=True, default=None, help="SGLang: launch every kernel eagerly"
        ),
        click.option("--max-num-seqs", type=int, default=None, help="vLLM: total running requests"),
        click.option("--max-num-batched-tokens", type=int, default=None, help="vLLM: token budget per batch"),
        click.option(
            "--async-scheduling/--no-async-scheduling",
            default=None,
            help="vLLM: async scheduling (one more batch in flight)",
        ),
        click.option(
            "--kernel-scale",
            type=float,
            default=None,
            help="what-if: every kernel takes this many times its calibrated time (0.5: a GPU twice as fast)",
        ),
        click.option(
            "--allreduce-scale",
            type=float,
            default=None,
            help="what-if: every TP collective takes this many times its calibrated time",
        ),
        click.option(
            "--pcie-bandwidth-scale",
            type=float,
            default=None,
            help="what-if: every link of the box carries this many times its bandwidth",
        ),
        click.option(
            "--cpu-iteration-ms",
            type=float,
            default=None,
            help="what-if: the scheduler's CPU time per iteration [default: the profile's]",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


SCENARIO_FLAGS = (
    "model",
    "profile",
    "engine",
    "engine_version",
    "allow_foreign_profile",
    "box",
    "nodes",
    "network",
    "kv_cache_dtype",
    "input_len",
    "output_len",
    "seed",
    "max_running_requests",
    "pp_max_micro_batch_size",
    "pp_async_batch_depth",
    "chunked_prefill_size",
    "disable_cuda_graph",
    "max_num_seqs",
    "max_num_batched_tokens",
    "async_scheduling",
    "kernel_scale",
    "allreduce_scale",
    "pcie_bandwidth_scale",
    "cpu_iteration_ms",
)


def scenario_kwargs(opts: dict) -> dict:
    """The shared flags as `build_scenario` keyword arguments (unset ones left out)."""
    kw = {k: opts.pop(k) for k in SCENARIO_FLAGS}
    kw["disable_cuda_graph"] = kw["disable_cuda_graph"] or None
    return kw


@cli.command()
@click.option(
    "--tp",
    "--tensor-parallel-size",
    "--tp-size",
    "tp",
    type=int,
    default=1,
    show_default=True,
    help="tensor-parallel size (GPUs per stage)",
)
@click.option(
    "--pp",
    "--pipeline-parallel-size",
    "--pp-size",
    "pp",
    type=int,
    default=1,
    show_default=True,
    help="pipeline-parallel size (stages)",
)
@click.option(
    "--conc",
    "--max-concurrency",
    "conc",
    type=int,
    default=None,
    help="closed-loop concurrency C (clients); one of --conc, --rate, --trace is needed",
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
    help="replay a CSV: arrival_s,input_tokens,output_tokens",
)
@click.option("--layers", default=None, help="explicit layers per stage, e.g. 7,7,7,8,8,8,8,8")
@scenario_options
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the table")
@click.option(
    "--intervals/--no-intervals",
    default=True,
    show_default=True,
    help="prediction intervals (docs/uncertainty.md): 4 short runs more",
)
@click.option(
    "--sensitivity", is_flag=True, help="a tornado: which parameters and workload assumptions move the answer"
)
@click.option(
    "--step", type=float, default=0.2, show_default=True, help="--sensitivity: relative step of each item"
)
@click.option(
    "--plot",
    "plot_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="--sensitivity: write the tornado figure here (.png, .pdf, .svg)",
)
def predict(
    tp, pp, conc, rate, num_requests, trace, layers, as_json, intervals, sensitivity, step, plot_file, **opts
):
    """Predict one scenario (default: Kimi K2.6 with SGLang on 8 x RTX PRO 6000)."""
    from . import api, report
    from .scenario import build_scenario

    require(
        plot_file is None or sensitivity, "--plot draws the sensitivity tornado: give --sensitivity with it"
    )
    scenario = build_scenario(
        tp=tp,
        pp=pp,
        concurrency=conc,
        rate_rps=rate,
        num_requests=num_requests,
        trace=trace,
        layers=_layers(layers),
        **scenario_kwargs(opts),
    )
    if sensitivity:
        import json

        from .sensitivity import plot
        from .sensitivity import sensitivity as tornado

        sens = tornado(scenario, step)
        if plot_file:
            plot(sens, plot_file)
        click.echo(json.dumps(sens.to_dict(), indent=2) if as_json else sens.table())
        return
    result = api.run(scenario)
    if intervals:
        from .uncertainty import attach

        result = attach(result, scenario)
    click.echo(report.to_json(result) if as_json else report.table(result))


@cli.group()
def calibrate():
    """Measure or import a box's costs into a calibration profile."""


@calibrate.group("import")
def calibrate_import():
    """Import measurements people already have into a profile."""


@calibrate_import.command("aiconfigurator")
@click.argument("system_dir", type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="profile directory to write")
@click.option("--kernel-set", type=click.Choice(["sglang", "vllm"]), default="sglang", show_default=True)
@click.option("--box", required=True, help="box preset or .toml the tables were measured on")
@click.option("--name", default=None, help="profile name [default: the --out folder's name]")
def import_aiconfigurator(system_dir, out, kernel_set, box, name):
    """Tables from an AIConfigurator system folder (e.g. .../rtx_pro_6000_server)."""
    from .calibrate.importers.aiconfigurator import import_profile

    tables = import_profile(system_dir, out, kernel_set=kernel_set, box=box, name=name)
    click.echo(f"wrote {out}: " + ", ".join(f"{k} {len(v)} rows" for k, v in tables.items()))


@calibrate_import.command("nccl-tests")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--profile", "profile_dir", required=True, help="profile directory to add the table to")
@click.option("--out", default=None, help="write the result here instead of in place")
@click.option("--op", default=None, help="all_reduce, all_gather, ... [default: read from the output]")
@click.option("--gpus", type=int, default=None, help="GPUs in the run [default: read from the output]")
def import_nccl_tests(file, profile_dir, out, op, gpus):
    """Collective latencies from nccl-tests text output (all_reduce_perf, all_gather_perf, ...)."""
    from .calibrate.importers.nccl_tests import import_file

    rows = import_file(file, profile_dir, out, op=op, gpus=gpus)
    click.echo(
        f"added {len(rows)} {rows.op.iloc[0]} rows on {rows.gpus.iloc[0]} GPUs to {out or profile_dir}"
    )


@calibrate_import.command("bench")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--profile", "profile_dir", required=True, help="profile directory to add the points to")
@click.option("--out", default=None, help="write the result here instead of in place")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["sglang", "vllm", "csv"]),
    required=True,
    help="sglang: bench_serving JSON lines; vllm: vllm bench serve JSON; csv: pipesim's measured layout",
)
@click.option("--tp", type=int, default=None, help="the run's tp (not in the benchmark output)")
@click.option("--pp", type=int, default=None, help="the run's pp")
@click.option("--conc", type=int, default=None, help="concurrency, where the output lacks max_concurrency")
@click.option("--name", default="", help="a label for the points")
@click.option("--model", default="", help="model preset or config the run served [default: the profile's]")
def import_bench(file, profile_dir, out, fmt, tp, pp, conc, name, model):
    """End-to-end points (becomes the profile's measured set)."""
    from .calibrate.importers.bench import import_file

    added, total = import_file(
        file, profile_dir, out, fmt=fmt, tp=tp, pp=pp, conc=conc, name=name, model=model
    )
    click.echo(f"added {added} measured point(s) to {out or profile_dir} ({total} in all)")


@calibrate.command("fit")
@click.option("--profile", "profile_dir", required=True, help="profile directory (with measured points)")
@click.option(
    "--params",
    "names",
    required=True,
    help="comma-separated parameters to fit, e.g. cpu_iteration_ms,allreduce_offset_us",
)
@click.option("--out", default=None, help="write the fitted profile here instead of in place")
@click.option("--no-loo", is_flag=True, help="skip the leave-one-out errors (faster)")
@click.option(
    "--progress/--no-progress", default=None, help="progress bar with ETA on stderr [default: on a terminal]"
)
def calibrate_fit(profile_dir, names, out, no_loo, progress):
    """Fit free parameters to the profile's measured points by least squares."""
    from .calibrate.fit import fit_profile, solves
    from .profile import load_profile
    from .progress import bar

    n = solves(load_profile(profile_dir).measured, not no_loo)
    with bar(n, "fit (solves: the fit, then one per point left out)", progress, unit="solve") as b:
        result = fit_profile(
            profile_dir,
            [n.strip() for n in names.split(",") if n.strip()],
            out,
            loo=not no_loo,
            on_solve=b.update,
        )
    click.echo(result.report())


@cli.command()
@click.option("--profile", default=None, help="profile name or directory [default: the reference deployment]")
@click.option(
    "--max-error", type=float, default=10.0, show_default=True, help="largest allowed error per point, %"
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="print one JSON object (profile, MAPE, the limit, every point: measured, predicted, error %)",
)
@click.option(
    "--corpus",
    "corpus_dir",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[DIR]",
    help="check against the public validation corpus (the shipped one, or DIR) instead of a profile",
)
@click.option(
    "--progress/--no-progress", default=None, help="progress bar with ETA on stderr [default: on a terminal]"
)
def validate(profile, max_error, as_json, corpus_dir, progress):
    """Every measured point of a profile: predicted vs measured. Exit 1 if one is off by more than --max-error.
    With --corpus: every corpus run pipesim can express, its error, ranking agreement and interval coverage."""
    from .calibrate.validate import check
    from .profile import load_profile
    from .progress import bar
    from .scenario import DEFAULT_PROFILE

    if corpus_dir is not None:
        from .calibrate import crosscheck
        from .corpus import load_corpus

        chk = crosscheck.check(load_corpus(corpus_dir or None))
        click.echo(crosscheck.to_json(chk) if as_json else crosscheck.text(chk))
        return

    prof = load_profile(profile or DEFAULT_PROFILE)
    with bar(len(prof.measured), "validate", progress, unit="point") as b:
        result = check(prof, number(max_error, "--max-error", 0.0, above=True), on_point=b.update)
    click.echo(result.to_json() if as_json else result.text())
    if not result.passed:
        sys.exit(1)


@cli.command()
@click.option("--profile", default=None, help="profile name or directory [default: the reference deployment]")
@click.option(
    "--progress/--no-progress", default=None, help="progress bar with ETA on stderr [default: on a terminal]"
)
def diagnose(profile, progress):
    """Where the box loses time: each measured point against the box's own tables."""
    from .calibrate.diagnose import diagnose as run_diagnosis
    from .calibrate.diagnose import steps
    from .profile import load_profile
    from .progress import bar
    from .scenario import DEFAULT_PROFILE

    prof = load_profile(profile or DEFAULT_PROFILE)
    with bar(steps(prof), "diagnose (points, then hypothesis fits)", progress, unit="step") as b:
        diagnosis = run_diagnosis(prof, on_point=b.update)
    click.echo(diagnosis.text())


@cli.group()
def profiles():
    """List and inspect calibration profiles."""


@profiles.command("list")
def profiles_list():
    """The shipped profiles."""
    from .profile import load_profile, profile_names

    for name in profile_names():
        p = load_profile(name)
        click.echo(f"{name:40s} {p.engine} {p.engine_version:8s} box {p.box}")


@profiles.command("show")
@click.argument("name")
def profiles_show(name):
    """One profile: its box, engine, parameters and the source of every table."""
    from .profile import load_profile, profile_folder

    p = load_profile(name)
    click.echo(f"{p.name}: {p.meta.get('description', '')}")
    click.echo(f"  folder {profile_folder(name)}")
    click.echo(f"  box {p.box}, engine {p.engine} {p.engine_version}")
    click.echo("  parameters:")
    for k, v in vars(p.params).items():
        src = p.meta.get("param_sources", {}).get(k, "")
        click.echo(f"    {k:28s} {v!s:>12}   {src}")
    click.echo("  tables:")
    for t, df in p.tables.items():
        click.echo(f"    {t:14s} {len(df):>7,} rows   {p.sources.get(t, '')}")
    if p.deployment:
        click.echo("  deployment flags: " + ", ".join(f"{k}={v}" for k, v in p.deployment.items()))


@cli.command()
@click.option(
    "--gpus",
    default="8",
    show_default=True,
    metavar="N[,N..]",
    help="GPU count, or several: 2,4,8 (every tp x pp = count)",
)
@click.option(
    "--splits",
    default=None,
    metavar="TPxPP[,..]",
    help="only these splits, e.g. 2x4,8x1 (sets the GPU counts)",
)
@click.option(
    "--conc",
    "--max-concurrency",
    "conc",
    default=None,
    metavar="C[,C..]",
    help=f"concurrencies, comma-separated [default: {DEFAULT_CONC_TEXT}]",
)
@click.option(
    "--rate",
    "--request-rate",
    "rate",
    default=None,
    metavar="R[,R..]",
    help="open-loop Poisson arrival rates (req/s) instead of concurrencies",
)
@click.option("--num-requests", type=int, default=None, help="requests per point with --rate [default: 200]")
@scenario_options
@click.option("--out", default=None, help="write the table to this .csv or .parquet file")
@click.option(
    "--workers",
    type=int,
    default=None,
    help="local worker processes [default: every core; 1: in this process]",
)
@click.option(
    "--scheduler", default=None, help="run on a Dask cluster: its scheduler address, tcp://HOST:PORT"
)
@click.option("--progress/--no-progress", default=None, help="progress bar [default: on a terminal]")
def sweep(gpus, splits, conc, rate, num_requests, out, workers, scheduler, progress, **opts):
    """Every valid TP x PP split for the GPU count(s) x every load: a table."""
    import time

    from .files import TABLE_SUFFIXES, check_out_path, write_table
    from .sweep import summary
    from .sweep import sweep as run_sweep

    require(conc is None or rate is None, "give --conc or --rate, not both")
    if out is not None:
        check_out_path(out, TABLE_SUFFIXES, "output")
    load = dict(conc=parse_ints(DEFAULT_CONC_TEXT if conc is None else conc, "--conc"))
    if rate is not None:
        load.update(
            rate=parse_floats(rate, "--rate"), **({"num_requests": num_requests} if num_requests else {})
        )
    t = time.perf_counter()
    df = run_sweep(
        parse_ints(gpus, "--gpus"),
        splits=parse_splits(splits),
        scheduler=scheduler,
        workers=parse_workers(workers),
        progress=progress,
        **load,
        **scenario_kwargs(opts),
    )
    wall_s = time.perf_counter() - t
    click.echo(summary(df))
    click.echo(f"{len(df)} points in {wall_s:.1f} s" + (f" on {scheduler}" if scheduler else ""))
    if out is not None:
        write_table(df, out)
        click.echo(f"wrote {out}")


@cli.command()
@click.option(
    "--gpus", default="8", show_default=True, metavar="N[,N..]", help="GPU count, or several: 2,4,8"
)
@click.option(
    "--splits",
    default=None,
    metavar="TPxPP[,..]",
    help="only these splits, e.g. 2x4,8x1 (sets the GPU counts)",
)
@click.option(
    "--conc",
    "--max-concurrency",
    "conc",
    default=None,
    metavar="C[,C..]",
    help=f"concurrencies to try [default: {DEFAULT_CONC_TEXT}]",
)
@click.option(
    "--rate",
    "--request-rate",
    "rate",
    default=None,
    metavar="R[,R..]",
    help="open-loop Poisson arrival rates (req/s) to try instead of concurrencies",
)
@click.option("--num-requests", type=int, default=None, help="requests per point with --rate [default: 200]")
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
@scenario_options
@click.option("--workers", type=int, default=None, help="local worker processes [default: every core]")
@click.option("--scheduler", default=None, help="run on a Dask cluster: tcp://HOST:PORT")
@click.option("--progress/--no-progress", default=None, help="progress bar [default: on a terminal]")
def search(
    gpus,
    splits,
    conc,
    rate,
    num_requests,
    objective,
    min_per_request_tok_s,
    max_ttft_p50_ms,
    max_ttft_p99_ms,
    max_tpot_p50_ms,
    max_tpot_p99_ms,
    plot_file,
    from_file,
    workers,
    scheduler,
    progress,
    **opts,
):
    """The best split and load under constraints, the alternatives ranked, and why."""
    from pathlib import Path

    from .files import read_table
    from .search import search as run_search

    require(conc is None or rate is None, "give --conc or --rate, not both")
    if plot_file is not None:
        require(
            Path(plot_file).suffix.lower() in (".png", ".svg"),
            f"figure file '{plot_file}' must end in .png or .svg",
        )
    table = read_table(from_file) if from_file else None
    limits = {
        k: parse_number(v, "--" + k.replace("_", "-"))
        for k, v in dict(
            min_per_request_tok_s=min_per_request_tok_s,
            max_ttft_p50_ms=max_ttft_p50_ms,
            max_ttft_p99_ms=max_ttft_p99_ms,
            max_tpot_p50_ms=max_tpot_p50_ms,
            max_tpot_p99_ms=max_tpot_p99_ms,
        ).items()
    }
    run = {}
    if table is None:  # a table given: nothing is swept, and --gpus/--conc/--rate go unread
        if rate is not None:
            run["rate"] = parse_floats(rate, "--rate")
            if num_requests is not None:
                run["num_requests"] = num_requests
        run["conc"] = parse_ints(DEFAULT_CONC_TEXT if conc is None else conc, "--conc", MAX_CONCURRENCY)
        run.update(
            scheduler=scheduler, workers=parse_workers(workers), progress=progress, **scenario_kwargs(opts)
        )
        gpus = parse_ints(gpus, "--gpus")
    result = run_search(gpus, objective, splits=parse_splits(splits), table=table, **limits, **run)
    click.echo(result.text())
    if plot_file is not None:
        from . import plot as pl

        pl.save(pl.pareto(result), plot_file)
        click.echo(f"wrote {plot_file}")


@cli.command()
@click.argument("results")
@click.option("--out-dir", default=".", show_default=True, help="folder for the figures")
@click.option("--format", "fmt", default="png", show_default=True, help="png or svg")
@click.option("--prefix", default="", help="prefix of the file names")
def plot(results, out_dir, fmt, prefix):
    """Figures of a sweep table: throughput vs concurrency, the trade-off curve, the time breakdown."""
    from . import plot as pl
    from .files import ensure_dir, read_table

    ensure_dir(out_dir, "figure")  # before reading: a folder that cannot be made fails first
    for path in pl.save_all(read_table(results), out_dir, fmt, prefix):
        click.echo(f"wrote {path}")


@cli.command()
@click.option(
    "--tp",
    "--tensor-parallel-size",
    "--tp-size",
    "tp",
    type=int,
    default=1,
    show_default=True,
    help="tensor-parallel size",
)
@click.option(
    "--pp",
    "--pipeline-parallel-size",
    "--pp-size",
    "pp",
    type=int,
    default=1,
    show_default=True,
    help="pipeline-parallel size",
)
@click.option(
    "--conc", "--max-concurrency", "conc", type=int, default=None, help="closed-loop concurrency C (needed)"
)
@scenario_options
@click.option("--out", default="trace.json", show_default=True, help="the Chrome trace event file (.json)")
def trace(tp, pp, conc, out, **opts):
    """A Chrome / Perfetto trace of one run: a track per GPU and per PP hop."""
    from . import trace as tr
    from .files import check_out_path

    check_out_path(out, (".json",), "trace")
    obj, result = tr.trace(tp, pp, conc, **scenario_kwargs(opts))
    tr.write_trace(out, obj)
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


@calibrate.command("live")
@click.option("--model", "model_arg", required=True, help="preset name or path of a Hugging Face config.json")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="profile directory to write")
@click.option(
    "--hf-config",
    is_flag=True,
    help="also run the model's Hugging Face transformers code (random weights from the config, no "
    "download) for the decode loop's CPU costs and its decoder layers",
)
@click.option("--name", default=None, help="profile name [default: live-<gpu>-<model>]")
@click.option(
    "--budget-s",
    type=float,
    default=420.0,
    show_default=True,
    help="wall-clock budget; optional extras are skipped once it runs low",
)
@click.option(
    "--reps", type=int, default=30, show_default=True, help="timed repetitions per operation (median)"
)
@click.option("--warmup", type=int, default=5, show_default=True, help="untimed calls before timing")
@click.option(
    "--collectives/--no-collectives",
    default=True,
    show_default=True,
    help="with several GPUs visible: NCCL all-reduce, all-gather and P2P tables",
)
def calibrate_live(model_arg, out, hf_config, name, budget_s, reps, warmup, collectives):
    """Measure MODEL's operation costs on this machine's NVIDIA GPUs into a profile
    that `pipesim predict --profile OUT --model MODEL` uses (needs pipesim[live])."""
    from .calibrate.live import run_live

    path = run_live(
        model_arg,
        out,
        hf_config=hf_config,
        name=name,
        budget_s=budget_s,
        reps=reps,
        warmup=warmup,
        collectives=collectives,
    )
    click.echo(f"wrote {path}")


@cli.group()
def boxes():
    """The box catalogue: presets, their numbers and where each comes from (docs/boxes.md)."""


@boxes.command("list")
def boxes_list():
    """One line per preset: name, GPUs, GPU model, memory, interconnect."""
    from .hardware import box_names, load_box, summary_line

    for name in box_names():
        click.echo(summary_line(name, load_box(name)))


@boxes.command("show")
@click.argument("name")
@click.option("--nodes", type=int, default=1, show_default=True, help="show a cluster of this many boxes")
@click.option("--network", default=None, help="what joins the nodes [default: the box's [network]]")
def boxes_show(name, nodes, network):
    """Every field of box NAME (a preset or .toml) with its source, and the topology tree."""
    from .hardware import details, load_box

    click.echo("\n".join(details(load_box(name, nodes, network))))


def main(argv=None) -> None:
    """Entry point: user errors become one line and exit code 2; bugs keep their traceback."""
    try:
        cli.main(args=argv, prog_name="pipesim", standalone_mode=False)
    except UserError as exc:
        click.echo(f"pipesim: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.exceptions.Abort:
        click.echo("pipesim: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        msg = " ".join(exc.format_message().split())
        click.echo(f"pipesim: error: {msg}", err=True)
        sys.exit(EXIT_BAD_INPUT if isinstance(exc, click.UsageError) or exc.exit_code == 2 else exc.exit_code)
    except OSError as exc:
        click.echo(f"pipesim: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()

"""Calibration: `pipesim calibrate` (import, fit, live), `pipesim validate`, `pipesim diagnose`."""

from __future__ import annotations

import sys

import click

from ..base.checks import number, whole


@click.group()
def calibrate() -> None:
    """Measure or import a box's costs into a calibration profile."""


@calibrate.group("import")
def calibrate_import() -> None:
    """Import measurements people already have into a profile."""


@calibrate_import.command("aiconfigurator")
@click.argument("system_dir", type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="profile directory to write")
@click.option("--kernel-set", type=click.Choice(["sglang", "vllm"]), default="sglang", show_default=True)
@click.option("--box", required=True, help="box preset or .toml the tables were measured on")
@click.option("--name", default=None, help="profile name [default: the --out folder's name]")
@click.option(
    "--engine-version",
    default=None,
    help="the engine version whose tables to read (nested layout: <op>/<engine>/<version>/; "
    "flat: the vllm-<version> subfolder) [default: the newest that measured each table]",
)
def import_aiconfigurator(
    system_dir: str, out: str, kernel_set: str, box: str, name: str | None, engine_version: str | None
) -> None:
    """Tables from an AIConfigurator system folder (e.g. .../rtx_pro_6000_server), flat or
    as aiconfigurator-core ships it (<system>/<op>/<engine>/<version>/*.parquet)."""
    from ..profiles.importers.aiconfigurator import import_profile

    tables = import_profile(
        system_dir, out, kernel_set=kernel_set, box=box, name=name, version=engine_version
    )
    click.echo(f"wrote {out}: " + ", ".join(f"{k} {len(v)} rows" for k, v in tables.items()))


@calibrate_import.command("nccl-tests")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--profile", "profile_dir", required=True, help="profile directory to add the table to")
@click.option("--out", default=None, help="write the result here instead of in place")
@click.option("--op", default=None, help="all_reduce, all_gather, ... [default: read from the output]")
@click.option("--gpus", type=int, default=None, help="GPUs in the run [default: read from the output]")
def import_nccl_tests(file: str, profile_dir: str, out: str | None, op: str | None, gpus: int | None) -> None:
    """Collective latencies from nccl-tests text output (all_reduce_perf, all_gather_perf, ...)."""
    from ..profiles.importers.nccl_tests import import_file

    rows = import_file(file, profile_dir, out, op=op, gpus=gpus)
    click.echo(
        f"added {len(rows)} {rows.op.iloc[0]} rows on {rows.gpus.iloc[0]} GPUs to {profile_dir if out is None else out}"
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
    help="sglang: bench_serving JSON lines; vllm: vllm bench serve JSON (one result, or several "
    "--append-result wrote); csv: pipesim's measured layout",
)
@click.option(
    "--tp",
    type=int,
    default=None,
    help="the run's tp (not in the benchmark output; vllm: unless the run stored --metadata tp=N pp=N)",
)
@click.option("--pp", type=int, default=None, help="the run's pp")
@click.option("--conc", type=int, default=None, help="concurrency, where the output lacks max_concurrency")
@click.option("--name", default="", help="a label for the points")
@click.option("--model", default="", help="model preset or config the run served [default: the profile's]")
def import_bench(
    file: str,
    profile_dir: str,
    out: str | None,
    fmt: str,
    tp: int | None,
    pp: int | None,
    conc: int | None,
    name: str,
    model: str,
) -> None:
    """End-to-end points (becomes the profile's measured set)."""
    from ..profiles.importers.bench import import_file

    added, total = import_file(
        file, profile_dir, out, fmt=fmt, tp=tp, pp=pp, conc=conc, name=name, model=model
    )
    click.echo(f"added {added} measured point(s) to {profile_dir if out is None else out} ({total} in all)")


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
@click.option(
    "--jobs",
    type=int,
    default=None,
    help="processes to spread each round's simulations over [default: the CPUs, at most 4]",
)
def calibrate_fit(
    profile_dir: str, names: str, out: str | None, no_loo: bool, progress: bool | None, jobs: int | None
) -> None:
    """Fit free parameters to the profile's measured points by least squares."""
    from ..base.pool import default_jobs
    from ..base.progress import bar
    from ..calibrate.fit import fit_profile

    procs = default_jobs() if jobs is None else whole(jobs, "--jobs", 1, 64)
    with bar(None, "fit (simulations, of about the total shown)", progress, unit="sim") as b:

        def advance(done: int, expected: int) -> None:
            b.total = expected
            b.update(done - b.n)

        result = fit_profile(
            profile_dir,
            [n.strip() for n in names.split(",") if n.strip()],
            out,
            loo=not no_loo,
            on_simulation=advance,
            jobs=procs,
        )
    click.echo(result.report())


@click.command()
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
@click.option(
    "--jobs",
    type=int,
    default=None,
    help="with --corpus: processes to spread the runs over [default: the CPUs, at most 4]",
)
@click.option(
    "--cache/--no-cache",
    default=True,
    show_default=True,
    help="with --corpus: keep each run's compared numbers, so a run whose rows, scenario and pipesim "
    "did not change is not simulated again (PIPESIM_CACHE_DIR, default ~/.cache/pipesim)",
)
def validate(
    profile: str | None,
    max_error: float,
    as_json: bool,
    corpus_dir: str | None,
    progress: bool | None,
    jobs: int | None,
    cache: bool,
) -> None:
    """Every measured point of a profile: predicted vs measured. Exit 1 if one is off by more than --max-error.
    With --corpus: every corpus run pipesim can express, its error, ranking agreement and interval coverage."""
    from ..base.progress import bar
    from ..calibrate.validate import check
    from ..profiles.profile import DEFAULT_PROFILE, load_profile

    if corpus_dir is not None:
        from ..base.cache import ResultCache
        from ..base.pool import default_jobs
        from ..calibrate import crosscheck
        from ..calibrate.corpus import load_corpus

        n = default_jobs() if jobs is None else whole(jobs, "--jobs", 1, 64)
        corpus = load_corpus(corpus_dir or None)
        with bar(corpus.run_id.nunique(), "validate --corpus", progress) as b:
            chk = crosscheck.check(corpus, lambda _: b.update(), jobs=n, cache=ResultCache(enabled=cache))
        click.echo(crosscheck.to_json(chk) if as_json else crosscheck.text(chk))
        return

    prof = load_profile(profile or DEFAULT_PROFILE)
    with bar(len(prof.measured), "validate", progress, unit="point") as b:
        result = check(prof, number(max_error, "--max-error", 0.0, above=True), on_point=b.update)
    click.echo(result.to_json() if as_json else result.text())
    if not result.passed:
        sys.exit(1)


@click.command()
@click.option("--profile", default=None, help="profile name or directory [default: the reference deployment]")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the text")
@click.option(
    "--progress/--no-progress", default=None, help="progress bar with ETA on stderr [default: on a terminal]"
)
def diagnose(profile: str | None, as_json: bool, progress: bool | None) -> None:
    """Where the box loses time: each measured point against the box's own tables."""
    from ..base.progress import bar
    from ..calibrate.diagnose import diagnose as run_diagnosis
    from ..calibrate.diagnose import steps
    from ..profiles.profile import DEFAULT_PROFILE, load_profile

    prof = load_profile(profile or DEFAULT_PROFILE)
    with bar(steps(prof), "diagnose (points, then hypothesis fits)", progress, unit="step") as b:
        diagnosis = run_diagnosis(prof, on_point=b.update)
    if as_json:
        from ..base.jsonout import dumps

        click.echo(dumps(diagnosis.to_dict()))
        return
    click.echo(diagnosis.text())


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
def calibrate_live(
    model_arg: str,
    out: str,
    hf_config: bool,
    name: str | None,
    budget_s: float,
    reps: int,
    warmup: int,
    collectives: bool,
) -> None:
    """Measure MODEL's operation costs on this machine's NVIDIA GPUs into a profile
    that `pipesim predict --profile OUT --model MODEL` uses (needs pipesim[live])."""
    from ..calibrate.live.run import run_live

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

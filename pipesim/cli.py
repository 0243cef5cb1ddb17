"""The `pipesim` command line. Bad input: one line on stderr, exit code 2."""

from __future__ import annotations

import sys

import click

from .errors import UserError

EXIT_BAD_INPUT = 2


def _layers(value: str | None):
    if value is None:
        return None
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise UserError(f"--layers '{value}' must be comma-separated whole numbers, e.g. 7,7,7,8,8,8,8,8") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipesim")
def cli():
    """pipesim: predict throughput and latency of an LLM inference engine for any
    TP x PP split and concurrency, and show where the time goes."""


@cli.command()
@click.option("--tp", type=int, default=1, show_default=True, help="tensor-parallel size (GPUs per stage)")
@click.option("--pp", type=int, default=1, show_default=True, help="pipeline-parallel size (stages)")
@click.option("--conc", type=int, default=None, help="closed-loop concurrency C (clients)")
@click.option("--rate", type=float, default=None, help="open-loop Poisson arrival rate, requests/s (instead of --conc)")
@click.option("--num-requests", type=int, default=None, help="requests to send with --rate or from --trace")
@click.option("--trace", type=click.Path(dir_okay=False), default=None, help="replay a CSV: arrival_s,input_tokens,output_tokens")
@click.option("--model", default=None, help="preset name or path of a Hugging Face config.json [default: kimi-k2.6]")
@click.option("--profile", default=None, help="calibration profile name or directory [default: the reference box]")
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), default=None, help="engine [default: the profile's]")
@click.option("--box", default=None, help="box preset or .toml [default: the profile's]")
@click.option("--layers", default=None, help="explicit layers per stage, e.g. 7,7,7,8,8,8,8,8")
@click.option("--input-len", default="256", show_default=True, help="prompt tokens: N or LO:HI (uniform)")
@click.option("--output-len", default="300", show_default=True, help="output tokens: N or LO:HI (uniform)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-running-requests", type=int, default=None, help="SGLang: total running requests")
@click.option("--pp-max-micro-batch-size", type=int, default=None, help="SGLang: per-slot cap [default: max-running-requests // pp]")
@click.option("--pp-async-batch-depth", type=int, default=None, help="SGLang: extra micro-batch slots [default 0]")
@click.option("--chunked-prefill-size", type=int, default=None, help="SGLang: prefill chunk tokens [default by GPU memory]")
@click.option("--disable-cuda-graph", is_flag=True, default=None, help="SGLang: launch every kernel eagerly")
@click.option("--max-num-seqs", type=int, default=None, help="vLLM: total running requests")
@click.option("--max-num-batched-tokens", type=int, default=None, help="vLLM: token budget per batch")
@click.option("--async-scheduling/--no-async-scheduling", default=None, help="vLLM: async scheduling (one more batch in flight)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the table")
def predict(tp, pp, conc, rate, num_requests, trace, model, profile, engine, box, layers, input_len, output_len, seed,
            max_running_requests, pp_max_micro_batch_size, pp_async_batch_depth, chunked_prefill_size,
            disable_cuda_graph, max_num_seqs, max_num_batched_tokens, async_scheduling, as_json):
    """Predict one scenario (default: Kimi K2.6 with SGLang on 8 x RTX PRO 6000)."""
    from . import api, report
    from .scenario import DEFAULT_MODEL, DEFAULT_PROFILE

    knobs = dict(max_running_requests=max_running_requests, pp_max_micro_batch_size=pp_max_micro_batch_size,
                 pp_async_batch_depth=pp_async_batch_depth, chunked_prefill_size=chunked_prefill_size,
                 disable_cuda_graph=disable_cuda_graph or None, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                 async_scheduling=async_scheduling)
    result = api.predict(tp, pp, conc, rate_rps=rate, num_requests=num_requests, trace=trace,
                         model=model or DEFAULT_MODEL, profile=profile or DEFAULT_PROFILE, engine=engine, box=box,
                         layers=_layers(layers), input_len=input_len, output_len=output_len, seed=seed, **knobs)
    click.echo(report.to_json(result) if as_json else report.table(result))


@cli.group()
def calibrate():
    """Measure or import a box's costs into a calibration profile."""


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
    from .profile import load_profile

    p = load_profile(name)
    click.echo(f"{p.name}: {p.meta.get('description', '')}")
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

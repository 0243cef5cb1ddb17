"""The `pipesim` command line: click wiring only (each command calls the module that owns
its work; defaults come from the modules that own them). Bad input: one line on stderr,
exit code 2."""

from __future__ import annotations

import signal
import sys
import warnings
from typing import TextIO

import click

from ..base.errors import PipesimWarning, UserError
from ..base.writes import Terminated
from .calibration import calibrate, diagnose, validate
from .explore import plot, search, sweep
from .presets import boxes, profiles
from .single import predict, trace

EXIT_BAD_INPUT = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipesim")
def cli() -> None:
    """pipesim: predict throughput and latency of an LLM inference engine for any
    TP x PP split and concurrency, and show where the time goes."""


for _command in (predict, trace, sweep, search, plot, calibrate, validate, diagnose, profiles, boxes):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line and exit code 2; bugs keep their
    traceback; pipesim's warnings (PipesimWarning) are one line on stderr."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if issubclass(category, PipesimWarning):
                click.echo(f"pipesim: warning: {message}", err=True)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        _main(argv)


def _main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="pipesim", standalone_mode=False)
    except UserError as exc:
        click.echo(f"pipesim: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, Terminated):  # SIGTERM while writing (base/writes.py)
            click.echo("pipesim: terminated", err=True)
            sys.exit(128 + signal.SIGTERM)
        click.echo("pipesim: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        msg = " ".join(exc.format_message().split())
        click.echo(f"pipesim: error: {msg}", err=True)
        sys.exit(EXIT_BAD_INPUT if isinstance(exc, click.UsageError) or exc.exit_code == 2 else exc.exit_code)
    except OSError as exc:
        click.echo(f"pipesim: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)

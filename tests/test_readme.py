"""Every `pipesim` command in the README runs, so the README cannot drift from what
pipesim does. Commands run in a scratch folder holding the files they name (a trace
CSV, a model config, nccl-tests output, bench_serving and vllm bench JSON, a measured
points CSV, a profile copy as `myprof`); sweeps, searches and traces get short
requests (--input-len 32 --output-len 16) to stay quick. Those that need what a test
machine lacks, or take minutes, are parsed and checked by the command line (every
option known, every value of the right type) without running, each for the reason
given in DRY."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import click
import pytest

from pipesim.cli import cli, main

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SHORT = ["--input-len", "32", "--output-len", "16"]

# command prefix -> why it is parsed, not run
DRY = {
    "pipesim predict --tp 2 --pp 4 --conc 64 --sensitivity": "the sensitivity reruns the scenario once per input "
    "(tests/test_sensitivity.py runs it small)",
    "pipesim sweep --gpus 8 --scheduler": "needs a running Dask cluster (tests/test_sweep.py starts one)",
    "pipesim calibrate import aiconfigurator path/to/system_dir": "needs AIConfigurator's raw tables "
    "(tests/test_calibration.py imports them when present)",
    "pipesim calibrate fit": "a fit runs for minutes (tests/test_calibration.py fits small)",
    "pipesim validate --corpus": "simulates every corpus run, minutes (tests/test_crosscheck.py checks it small)",
    "pipesim diagnose": "fits every hypothesis to every point, tens of seconds (tests/test_calibration.py)",
    "pipesim calibrate live": "needs NVIDIA GPUs and torch (tests/test_live_*.py)",
    "pipesim predict --profile my-h200": "needs the profile `calibrate live` writes",
}
# command prefix -> what its output must say (a regular expression)
EXPECT = {
    "pipesim predict --tp 1 --pp 8 --conc 64 --output-len 1000 --mem-fraction-static 0.803": "mem_fraction_static "
    r"0\.803 \[user\].*KV 30,033 tokens(.|\n)*KV retractions [1-9]",
    "pipesim predict --tp 1 --pp 8 --conc 64 --profile rtx-pro-6000-sglang-healthy --max-running-requests 64": "per-slot cap 8",
    "pipesim predict --tp 2 --pp 4 --rate 2": "req/s arrive",
    "pipesim predict --tensor-parallel-size 2 --pipeline-parallel-size 4 --max-concurrency 64": "TP2 x PP4",
    "pipesim search": "best:",
    "pipesim plot results.csv --out-dir figures": "figures/bubble_cause.png",
    "pipesim profiles show": "folder ",
    "pipesim boxes list": "h100-sxm-8x",
}
SLOW_KINDS = ("sweep", "search", "trace")  # given short requests


def readme_commands() -> list[str]:
    """Every `pipesim ...` command in the README's indented blocks (comments cut; in a
    chain `a && pipesim ...` the pipesim part)."""
    out = []
    for line in (REPO / "README.md").read_text().splitlines():
        if not line.startswith("    "):
            continue
        text = line.split("  #")[0].strip()
        for part in text.split("&&"):
            part = part.strip()
            if part.startswith("pipesim "):
                out.append(part)
    return out


def _match(table: dict, command: str):
    return next((v for k, v in table.items() if command.startswith(k)), None)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    from pipesim.profiles.profile import profile_folder

    t = tmp_path_factory.mktemp("readme")
    (t / "requests.csv").write_text("arrival_s,input_tokens,output_tokens\n0,32,16\n0.5,48,8\n1.0,16,24\n")
    (t / "path" / "to").mkdir(parents=True)
    shutil.copy(
        REPO / "pipesim" / "data" / "models" / "llama-3.1-70b.json", t / "path" / "to" / "config.json"
    )
    shutil.copy(DATA / "all_reduce_perf_8gpu.txt", t / "all_reduce_perf.txt")
    shutil.copy(DATA / "sglang_bench_serving.jsonl", t / "results.jsonl")
    shutil.copy(DATA / "vllm_bench_serve.json", t / "result.json")
    deployment = profile_folder("rtx-pro-6000-sglang-deployment")
    shutil.copy(deployment / "measured.csv", t / "points.csv")
    shutil.copytree(deployment, t / "myprof")  # what `calibrate import aiconfigurator ... --out myprof` makes
    # a tiny sweep table, for `pipesim plot results.csv` run on its own (the README's sweep rewrites it)
    from pipesim.base.files import write_table
    from pipesim.explore.sweep import sweep

    write_table(sweep(8, [1, 4], workers=1, input_len="32", output_len="16"), t / "results.csv")
    return t


def test_the_readme_names_commands_and_every_exception_is_still_in_it():
    cmds = readme_commands()
    assert len(cmds) >= 30
    for table in (DRY, EXPECT):
        for prefix in table:
            assert any(c.startswith(prefix) for c in cmds), f"{prefix!r} is no longer in the README"


def _dry(args: list[str]) -> None:
    """Parse a command line down to its leaf command, as click would before running it."""
    ctx = cli.make_context("pipesim", list(args), resilient_parsing=False)
    cmd, rest = cli, ctx.protected_args + ctx.args
    while isinstance(cmd, click.Group):
        name, sub, rest = cmd.resolve_command(ctx, rest)
        ctx = sub.make_context(name, rest, parent=ctx)
        cmd, rest = sub, ctx.protected_args + ctx.args if isinstance(sub, click.Group) else []


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command(command, scratch, monkeypatch, capsys):
    monkeypatch.chdir(scratch)
    args = re.findall(r"'[^']*'|\S+", command)[1:]
    args = [a.strip("'") for a in args]
    if _match(DRY, command):
        _dry(args)
        return
    if args[0] in SLOW_KINDS:
        args += SHORT
    if args[0] in ("sweep", "search"):
        args += ["--workers", "1", "--no-progress"]
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    allowed = (0, 1) if args[0] == "validate" else (0,)  # validate: exit 1 when a point is off by more
    assert code in allowed, f"{command}: exit {code}\n{err}"
    assert "Traceback" not in err
    want = _match(EXPECT, command)
    if want:
        assert re.search(want, out), f"{command}: no {want!r} in\n{out}"

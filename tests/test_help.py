"""`--help` in sections (cli/help.py) and the engines' short flags: a planner finds the
load, the split, the model / box / profile, each engine's knobs and the what-ifs where
an engine's own --help puts them, and -tp / -pp / -dp / -ep mean what vLLM means."""

import re

import pytest
from click.testing import CliRunner

from pipesim.cli import cli
from pipesim.cli.help import SECTIONS, section_of
from pipesim.cli.options import KNOBS

COMMANDS = ("predict", "sweep", "search", "trace")


def _sections(command: str) -> dict[str, str]:
    out = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    parts = re.split(r"^(\S[^\n]*):\n", out, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_in_sections_and_each_option_is_listed_once(command):
    sections = _sections(command)
    assert {"Load", "Split", "Model, box and profile", "Output and running"} <= set(sections)
    assert "Options" not in sections  # no flat list left
    text = "\n".join(sections.values())
    for param in cli.commands[command].params:
        if param.hidden or not param.opts:  # pragma: no cover - none today
            continue
        assert text.count(param.opts[0] + ",") + text.count(param.opts[0] + " ") >= 1, param.opts[0]
    assert "--conc" in sections["Load"] and "--model" not in sections["Load"]
    assert ("--tp" in sections["Split"] or "--gpus" in sections["Split"]) and "--box" in sections[
        "Model, box and profile"
    ]


def test_engine_knobs_are_listed_under_the_engines_that_declare_them():
    sections = _sections("predict")
    assert "--max-num-seqs" in sections["Engine knobs: vLLM"]
    assert "--max-num-seqs" not in sections["Engine knobs: SGLang"]
    assert "--chunked-prefill-size" in sections["Engine knobs: SGLang"]
    assert "--kernel-scale" in sections["What-ifs (one physical cost changed)"]
    for name in KNOBS:
        assert section_of(name).startswith("Engine knobs"), name
    named = [n for _, names in SECTIONS for n in names]
    assert len(named) == len(set(named)), "an option in two sections"


@pytest.mark.parametrize(
    ("short", "long", "key"),
    [
        ("-tp", "--tensor-parallel-size", "tp"),
        ("-pp", "--pipeline-parallel-size", "pp"),
        ("-dp", "--dp", "dp"),
    ],
)
def test_vllms_short_flags_are_the_long_ones(short, long, key):
    cmd = cli.commands["predict"]
    a = cmd.make_context("predict", [short, "4", "--conc", "1"])
    b = cmd.make_context("predict", [long, "4", "--conc", "1"])
    assert a.params[key] == b.params[key] == 4


def test_ep_short_form_is_vllms_switch_and_sglangs_size_stays_long():
    cmd = cli.commands["predict"]
    ctx = cmd.make_context("predict", ["-ep", "--conc", "1"])
    assert ctx.params["enable_expert_parallel"] is True and ctx.params["ep"] == 1
    ctx = cmd.make_context("predict", ["--ep", "4", "--conc", "1"])
    assert ctx.params["ep"] == 4 and ctx.params["enable_expert_parallel"] is False

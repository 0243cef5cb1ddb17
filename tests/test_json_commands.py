"""`--json` on every command that prints a table (predict, sweep, search, validate, diagnose,
boxes list, profiles list): one object that any JSON parser reads (no NaN or Infinity
tokens), holding what the table shows."""

import json

import pytest
from click.testing import CliRunner

from pipesim.cli import cli
from pipesim.inputs.box import box_names
from pipesim.profiles.profile import profile_names


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _run(*args: str):
    out = CliRunner().invoke(cli, list(args))
    assert out.exit_code == 0, out.output
    return _strict(out.output)


def test_sweep_json_is_its_rows():
    obj = _run(
        "sweep", "--gpus", "2", "--model", "llama-3.1-8b", "--conc", "1,4", "--input-len", "16",
        "--output-len", "4", "--workers", "1", "--no-progress", "--json",
    )  # fmt: skip
    rows = obj["rows"]
    assert {(r["split"], r["conc"]) for r in rows} == {
        (s, c) for s in ("TP1 x PP2", "TP2 x PP1") for c in (1, 4)
    }
    assert all(r["output_throughput_tok_s"] > 0 for r in rows)
    assert obj["skipped"] == [] and obj["wall_s"] > 0


@pytest.mark.parametrize(
    ("args", "key", "names"),
    [(("boxes", "list"), "boxes", box_names), (("profiles", "list"), "profiles", profile_names)],
)
def test_catalogue_lists_as_json(args, key, names):
    obj = _run(*args, "--json")
    assert [r["name"] for r in obj[key]] == list(names())

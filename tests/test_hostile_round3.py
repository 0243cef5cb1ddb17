"""Hostile input, round 3 (docs/bad-input.md, "Hostile input, round 3"): the classes that
got through the first two rounds, a list of cases each, run as test_hostile_input.py
runs its own (one line, exit code 2, nothing in DIR written, moved, cut or left).

`round3_files(folder)` adds the broken files to test_hostile_input's folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from test_hostile_input import DOC, TINY, P, hostile_files, refused

D = "{t}"
FAST = ["--model", "llama-3.1-8b", "--output-len", "8", "--input-len", "16"]


def round3_files(t: Path) -> Path:
    """The broken files of this round's cases, beside the first rounds' (`hostile_files`)."""
    import json

    # 1. files a write must not harm: links, folders, a part file that is not a sweep's
    (t / "link.csv").symlink_to(t / "notaprofile.txt")
    (t / "link.png").symlink_to(t / "notaprofile.txt")
    (t / "rs-link.csv.part").symlink_to(t / "notaprofile.txt")
    (t / "rs-foreign.csv.part").write_text("name,size\nmine,1\nhalf,")
    (t / "dir.csv").mkdir()
    (t / "plink").symlink_to(t / "target")
    (t / "cfg-own.json").write_text(json.dumps(TINY))
    return t


_bench = ["calibrate", "import", "bench", f"{D}/tiny.json", "--profile", P, "--format", "vllm"]
_bench += ["--tp", "8", "--pp", "1", "--out"]
FILE_CASES: list[tuple[list[str], str]] = [
    (["sweep", "--conc", "1", "--out", f"{D}/link.csv", *FAST], "link.csv' is a symbolic link"),
    (["sweep", "--conc", "1", "--out", f"{D}/dir.csv", *FAST], "dir.csv' is a folder"),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/rs-link.csv", "--resume", *FAST],
        "rs-link.csv.part is a symbolic link",
    ),
    (["sweep", "--conc", "1", "--out", f"{D}/rs-link.csv", *FAST], "rs-link.csv.part is a symbolic link"),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/rs-foreign.csv", "--resume", *FAST],
        "rs-foreign.csv.part' is not a pipesim sweep table",
    ),
    (
        ["trace", "--conc", "1", "--model", f"{D}/cfg-own.json", "--out", f"{D}/cfg-own.json"],
        "is this command's --model input",
    ),
    (
        ["predict", "--conc", "1", "--sensitivity", "--plot", f"{D}/link.png", *FAST],
        "link.png' is a symbolic link",
    ),
    ([*_bench, f"{D}/plink"], "plink' is a symbolic link"),
    (["predict", "--conc", "1", "--profile", "", *FAST], "--profile is empty"),
    (["predict", "--conc", "1", "--model", ""], "--model is empty"),
    (["predict", "--conc", "1", "--box", "", *FAST], "--box is empty"),
    (["predict", "--trace", "", *FAST], "--trace is empty"),
    (["profiles", "show", ""], "the profile is empty"),
    ([*_bench, ""], "--out is empty"),
]

CASES = FILE_CASES


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return round3_files(hostile_files(tmp_path_factory.mktemp("hostile3")))


@pytest.mark.parametrize(
    "args, message", CASES, ids=[f"{i}:{' '.join(c[0][:4])[-40:]}" for i, c in enumerate(CASES)]
)
def test_hostile_round3(args, message, folder, capsys):
    refused(args, message, folder, capsys)


def test_every_round3_case_is_documented():
    doc = re.sub(r"\s+", " ", DOC.read_text())
    for _, message in CASES:
        assert re.sub(r"\s+", " ", message) in doc, message


def test_the_link_targets_are_untouched(folder):
    assert os.readlink(folder / "rs-link.csv.part") == str(folder / "notaprofile.txt")
    assert (folder / "rs-foreign.csv.part").read_text() == "name,size\nmine,1\nhalf,"

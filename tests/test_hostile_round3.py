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

    # 2. valid-looking input that would give a silent wrong answer: tables in the wrong unit,
    # parameters and enumerated values outside their range
    coll = "op,impl,gpus,nbytes,latency_ms\n"
    tables = {
        "t-us": ("collectives", coll + "all_reduce,nccl,8,256,20.5\nall_reduce,nccl,8,1048576,81.0\n"),
        "t-fast": ("collectives", coll + "all_reduce,nccl,8,1073741824,0.002\n"),
        "t-mixed": (
            "collectives",
            coll + "all_reduce,nccl,8,256,0.02\nall_reduce,nccl,8,512,20\nall_reduce,nccl,8,1024,0.021\n",
        ),
        "t-op": ("collectives", coll + "allreduce,nccl,8,256,0.02\n"),
        "t-dtype": ("gemm", "dtype,m,n,k,latency_ms\nbf61,1,4096,4096,0.03\n"),
        "t-dist": (
            "moe",
            "dtype,hidden,inter,topk,experts,moe_tp,distribution,tokens,latency_ms\n"
            "bf16,7168,2048,8,384,8,banana,1,0.05\n",
        ),
    }
    for name, (table, text) in tables.items():
        _copy(t, name, table=table, text=text)
    params = {
        "p-kscale0": '"kernel_scale" = 0',
        "p-arscale0": '"allreduce_scale" = 0.0',
        "p-banana": '"moe_distribution" = "banana"',
        "p-pl-x": '"moe_distribution" = "power_law_x"',
        "p-argpus": '"custom_allreduce_max_gpus" = 2.5',
    }
    for name, line in params.items():
        _copy(t, name, params=line)
    src = (Path(__file__).parent / "data" / "all_reduce_perf_8gpu.txt").read_text().splitlines()
    rows = []
    for line in src:  # nccl-tests output with its time column in seconds
        parts = line.split()
        if parts and parts[0].isdigit() and len(parts) in (12, 13):
            parts[-8] = f"{float(parts[-8]) * 1e-6:.3g}"
            line = "  ".join(parts)
        rows.append(line)
    (t / "all_reduce_perf_s.txt").write_text("\n".join(rows) + "\n")
    return t


def _copy(
    t: Path, name: str, table: str | None = None, text: str | None = None, params: str | None = None
) -> None:
    """A copy of the healthy profile with one table replaced or one parameter line added."""
    import gzip
    import shutil

    from pipesim.profiles.profile import profile_folder

    d = t / name
    shutil.copytree(profile_folder(P), d)
    if table is not None:
        with gzip.open(d / f"{table}.csv.gz", "wt") as fh:
            fh.write(text)
    if params is not None:
        toml = (d / "profile.toml").read_text()
        key = params.split(" = ")[0]
        lines = [ln for ln in toml.splitlines() if not ln.startswith(f"{key} = ")]
        toml = "\n".join(lines).replace("[params]", f"[params]\n{params}", 1)
        (d / "profile.toml").write_text(toml + "\n")


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

SILENT_CASES: list[tuple[list[str], str]] = [
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-us", *FAST],
        "t-us/collectives.csv.gz: even its fastest row, line 2 (op=all_reduce, impl=nccl, gpus=8, nbytes=256",
    ),
    (["predict", "--conc", "1", "--profile", f"{D}/t-us", *FAST], "was it written in microseconds?"),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-fast", *FAST],
        "the fastest link of NVIDIA RTX PRO 6000",
    ),
    (["predict", "--conc", "1", "--profile", f"{D}/t-fast", *FAST], "was it written in seconds?"),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-mixed", *FAST],
        "faster than a smaller nbytes of the same shape",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-op", *FAST],
        "column op: value 'allreduce' is not allowed",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-dtype", *FAST],
        "column dtype: value 'bf61' is not allowed",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-dist", *FAST],
        "column distribution: routing distribution 'banana' is not known",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-kscale0", *FAST],
        "parameter kernel_scale = 0 must be a finite number > 0",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-arscale0", *FAST],
        "parameter allreduce_scale = 0.0 must be a finite number > 0",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-banana", *FAST],
        "parameter moe_distribution 'banana' is not known",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-pl-x", *FAST],
        "parameter moe_distribution 'power_law_x' is not known",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-argpus", *FAST],
        "parameter custom_allreduce_max_gpus must be a whole number >= 0, got 2.5",
    ),
    (
        ["predict", "--conc", "1", "--moe-distribution", "banana", *FAST],
        "--moe-distribution 'banana' is not known",
    ),
    (
        ["predict", "--conc", "1", "--moe-distribution", "power_law_0", *FAST],
        "--moe-distribution 'power_law_0' is not known",
    ),
    (
        ["predict", "--conc", "1", "--moe-distribution", "power_law_inf", *FAST],
        "--moe-distribution 'power_law_inf' is not known",
    ),
    (
        ["predict", "--conc", "1", "--moe-distribution", "power_law_-1.2", *FAST],
        "--moe-distribution 'power_law_-1.2' is not known",
    ),
    (
        [
            "calibrate",
            "import",
            "nccl-tests",
            f"{D}/all_reduce_perf_s.txt",
            "--profile",
            f"{D}/target",
            "--gpus",
            "8",
            "--out",
            f"{D}/o12",
        ],
        "faster than any GPU operation (under 1 us)",
    ),
]

CASES = FILE_CASES + SILENT_CASES


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

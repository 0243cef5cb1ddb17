"""Hostile input, round 3 (docs/bad-input.md, "Hostile input, round 3"): the classes that
got through the first two rounds, a list of cases each, run as test_hostile_input.py
runs its own (one line, exit code 2, nothing in DIR written, moved, cut or left).

`round3_files(folder)` adds the broken files to test_hostile_input's folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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

    # 3. fields of the wrong type or out of range that raised deep inside (a traceback)
    for name, quant in QUANT.items():
        (t / f"q-{name}.json").write_text(json.dumps({**TINY, "quantization_config": quant}))
    for name, row in MEASURED.items():
        _copy(t, f"m-{name}", measured="tp,pp,conc,tok_s\n" + row + "\n")

    # 4. what pipesim writes for one-token outputs, read back: a sweep (its per-request
    # speed and TPOT not defined) and a measured point that asks for a speed at one token
    one_token_sweep(t / "sw-one.csv")
    _copy(
        t,
        "m-per-req-one",
        measured="tp,pp,conc,input_len,output_len,metric,tok_s\n8,1,1,16,1,per_request_tok_s,30\n",
    )

    # 5. unbounded memory or work: a table that inflates past its bounds, switch levels
    # without end, measured points that need days of simulation
    import gzip

    with gzip.open(t / "bomb-rows.csv.gz", "wb", compresslevel=1) as fh:  # 13 MB in 30 kB
        fh.write(b"dtype,m,n,k,latency_ms\n" + b"bf16,1,1,1,1\n" * 1_000_001)
    _copy(t, "t-bomb-rows")
    (t / "t-bomb-rows" / "gemm.csv.gz").write_bytes((t / "bomb-rows.csv.gz").read_bytes())
    (t / "bomb-rows.csv.gz").unlink()
    (t / "box-deep3000.toml").write_text(deep_box(3000))
    head = "model,tp,pp,conc,input_len,output_len,tok_s\n"
    _copy(t, "m-work", measured=head + "llama-3.1-8b,1,1,1,16,29000,30\n" * 210)
    _copy(t, "m-fit", measured=head + "llama-3.1-8b,1,1,1,16,2000,30\n" * 20)
    _copy(t, "m-rows", measured="tp,pp,conc,tok_s\n" + "8,1,1,30\n" * 1001)
    return t


def deep_box(levels: int) -> str:
    """A two-GPU box whose GPUs hang `levels` switch levels below the top of its tree."""
    links = ['{ child = "gpu0", parent = "s0", bw_gb_s = 100, latency_us = 1 }']
    links += ['{ child = "gpu1", parent = "s0", bw_gb_s = 100, latency_us = 1 }']
    links += [
        f'{{ child = "s{i}", parent = "s{i + 1}", bw_gb_s = 100, latency_us = 1 }}' for i in range(levels)
    ]
    return (
        'name = "deep"\n[gpu]\nname = "g"\ncount = 2\nmemory_bytes = 8e10\nmem_bw_bytes_s = 2e12\n'
        "flops_bf16 = 4e14\n[topology]\nlinks = [\n" + ",\n".join(links) + "\n]\n"
    )


ONE = ["--model", "llama-3.1-8b", "--output-len", "1", "--input-len", "16"]


def one_token_sweep(out: Path, *extra: str) -> None:
    """`pipesim sweep` of one-token outputs (two splits of 2 GPUs, C=1,2) into `out`."""
    from pipesim.cli import main

    main(["sweep", "--gpus", "2", "--conc", "1,2", "--out", str(out), *ONE, *extra])


def _copy(
    t: Path,
    name: str,
    table: str | None = None,
    text: str | None = None,
    params: str | None = None,
    measured: str | None = None,
) -> None:
    """A copy of the healthy profile with one table replaced, one parameter line added or
    its measured points written."""
    import gzip
    import shutil

    from pipesim.profiles.profile import profile_folder

    d = t / name
    shutil.copytree(profile_folder(P), d)
    if measured is not None:
        (d / "measured.csv").write_text(measured)
    if table is not None:
        with gzip.open(d / f"{table}.csv.gz", "wt") as fh:
            fh.write(text)
    if params is not None:
        toml = (d / "profile.toml").read_text()
        key = params.split(" = ")[0]
        lines = [ln for ln in toml.splitlines() if not ln.startswith(f"{key} = ")]
        toml = "\n".join(lines).replace("[params]", f"[params]\n{params}", 1)
        (d / "profile.toml").write_text(toml + "\n")


CT = "compressed-tensors"
QUANT = {
    "fp8-one": {"quant_method": "fp8", "weight_block_size": [128]},
    "fp8-str": {"quant_method": "fp8", "weight_block_size": "128"},
    "fp8-zero": {"quant_method": "fp8", "weight_block_size": [0, 0]},
    "fp8-neg": {"quant_method": "fp8", "weight_block_size": [-128, 128]},
    "fp8-ignore": {"quant_method": "fp8", "modules_to_not_convert": [1, 2]},
    "ct-gs-str": {
        "quant_method": CT,
        "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": "x"}}},
    },
    "ct-gs-neg": {"quant_method": CT, "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": -5}}}},
    "ct-targets": {"quant_method": CT, "config_groups": {"g": {"targets": 5, "weights": {"num_bits": 4}}}},
    "ct-strategy": {"quant_method": CT, "config_groups": {"g": {"weights": {"num_bits": 4, "strategy": 5}}}},
    "ct-type": {"quant_method": CT, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "decimal"}}}},
    "ct-block": {
        "quant_method": CT,
        "config_groups": {
            "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128]}}
        },
    },
    "ct-acts": {
        "quant_method": CT,
        "config_groups": {"g": {"weights": {"num_bits": 4}, "input_activations": 5}},
    },
    "ct-sym": {"quant_method": CT, "config_groups": {"g": {"weights": {"num_bits": 4, "symmetric": "yes"}}}},
    "mo-inner": {"quant_method": "modelopt", "quantization": "x"},
    "mo-algo": {"quant_method": "modelopt", "quant_algo": ["NVFP4"]},
    "mo-exclude": {"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "exclude_modules": "x"}},
    "awq-zp": {"quant_method": "awq", "zero_point": "no"},
    "awq-bits": {"quant_method": "awq", "bits": "4"},
    "gptq-gs-big": {"quant_method": "gptq", "group_size": 10**30},
    "gptq-gs-zero": {"quant_method": "gptq", "group_size": 0},
}
MEASURED = {
    "tp-inf": "inf,1,1,10",
    "tp-huge": "1e12,1,1,10",
    "conc-nan": "8,1,nan,10",
    "toks-inf": "8,1,1,inf",
}


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

_q = "quantization_config"
TRACEBACK_CASES: list[tuple[list[str], str]] = [
    (["predict", "--conc", "1", "--model", f"{D}/q-{name}.json"], says)
    for name, says in {
        "fp8-one": f"{_q}: 'weight_block_size' = [128] must be a list of 2 whole numbers from 1",
        "fp8-str": f"{_q}: 'weight_block_size' = '128' must be a list of 2 whole numbers",
        "fp8-zero": f"{_q}: 'weight_block_size' = [0, 0] must be a list of 2 whole numbers from 1",
        "fp8-neg": f"{_q}: 'weight_block_size' = [-128, 128] must be a list of 2 whole numbers from 1",
        "fp8-ignore": "list of unquantized modules must be a list of names ('modules_to_not_convert'), got [1, 2]",
        "ct-gs-str": f"{_q}.config_groups.g.weights: 'group_size' = 'x' must be a whole number from 1",
        "ct-gs-neg": f"{_q}.config_groups.g.weights: 'group_size' = -5 must be a whole number from 1",
        "ct-targets": f"{_q}.config_groups.g: 'targets' = 5 must be a list of names",
        "ct-strategy": "'strategy' = 5 must be one of group, channel, tensor, block, tensor_group, token",
        "ct-type": "'type' = 'decimal' must be one of int, float",
        "ct-block": "'block_structure' = [128] must be a list of 2 whole numbers from 1",
        "ct-acts": f"{_q}.config_groups.g.input_activations must be a JSON object, got int",
        "ct-sym": "'symmetric' = 'yes' must be true or false",
        "mo-inner": f"{_q}.quantization must be a JSON object, got str",
        "mo-algo": "modelopt quant_algo '['NVFP4']' is not modelled (NVFP4 or FP8)",
        "mo-exclude": "list of unquantized modules must be a list of names ('exclude_modules'), got 'x'",
        "awq-zp": f"{_q}: 'zero_point' = 'no' must be true or false",
        "awq-bits": f"{_q}: 'bits' = '4' must be a whole number from 1 to 64",
        "gptq-gs-big": f"{_q}: 'group_size' = 1000000000000000000000000000000 must be a whole number from -1",
        "gptq-gs-zero": f"{_q} 'group_size' = 0 must be -1 or >= 1",
    }.items()
]
TRACEBACK_CASES += [
    (
        ["validate", "--profile", f"{D}/m-tp-inf"],
        "measured.csv: line 2, column tp: inf must be a finite number > 0",
    ),
    (
        ["diagnose", "--profile", f"{D}/m-tp-inf"],
        "measured.csv: line 2, column tp: inf must be a finite number > 0",
    ),
    (
        [
            "calibrate",
            "fit",
            "--profile",
            f"{D}/m-tp-inf",
            "--params",
            "cpu_iteration_ms",
            "--out",
            f"{D}/o13",
        ],
        "measured.csv: line 2, column tp: inf must be a finite number > 0",
    ),
    (["validate", "--profile", f"{D}/m-tp-huge"], "column tp: 1e12 must be a whole number up to 65536"),
    (["validate", "--profile", f"{D}/m-conc-nan"], "column conc: nan must be a finite number > 0"),
    (["validate", "--profile", f"{D}/m-toks-inf"], "column tok_s: inf must be a finite number > 0"),
]

_one = ["search", "--from", f"{D}/sw-one.csv"]
_undefined = "is not defined at any point of the table: no measured request produced a second token"
UNDEFINED_CASES: list[tuple[list[str], str]] = [
    (
        [*_one, "--objective", "per-request"],
        f"--objective per-request: per-request decode speed {_undefined}",
    ),
    (
        [*_one, "--min-per-request-tok-s", "5"],
        f"--min-per-request-tok-s: per-request decode speed {_undefined}",
    ),
    ([*_one, "--max-tpot-p99-ms", "50"], f"--max-tpot-p99-ms: TPOT p99 {_undefined}"),
    ([*_one, "--max-tpot-p50-ms", "50", "--across-conditions"], f"--max-tpot-p50-ms: TPOT p50 {_undefined}"),
    (
        ["search", "--gpus", "2", "--conc", "1", "--objective", "per-request", *ONE],
        f"--objective per-request: per-request decode speed {_undefined}",
    ),
    (
        ["validate", "--profile", f"{D}/m-per-req-one"],
        "line 2: a per-request decode speed at output_len 1 is not defined",
    ),
]

_fast = ["--model", "llama-3.1-8b", "--input-len", "16", "--output-len", "8"]
WORK_CASES: list[tuple[list[str], str]] = [
    (
        ["predict", "--profile", f"{D}/t-bomb-rows", "--conc", "1", *_fast],
        "gemm.csv.gz: more than 1,000,000 rows, above the limit of 1,000,000; stopped reading there",
    ),
    (
        ["validate", "--profile", f"{D}/t-bomb-rows"],
        "gemm.csv.gz: more than 1,000,000 rows, above the limit of 1,000,000; stopped reading there",
    ),
    (
        ["predict", "--box", f"{D}/box-deep3000.toml", "--tp", "2", "--conc", "1", *_fast],
        "is 3001 links below the top of the tree, above the limit of 64",
    ),
    (
        ["predict", "--rate", "1000", "--num-requests", "1000000", *_fast],
        "this prediction runs 5 simulations needing about 875,000 decode batch steps together (the run: "
        "1 x 125,000; the interval's ensemble: 4 x 187,500), above the limit of 500,000",
    ),
    (
        ["predict", "--rate", "1000", "--num-requests", "300000", "--sensitivity", *_fast],
        "this sensitivity runs",
    ),
    (
        ["predict", "--conc", "1", "--ensemble", "--model", "llama-3.1-8b", "--input-len", "16"]
        + ["--output-len", "20000"],
        "this prediction runs 5 simulations needing about 2,380,000 decode batch steps together (the run: "
        "1 x 340,000; the interval's ensemble: 4 x 510,000)",
    ),
    (["validate", "--profile", f"{D}/m-work"], "validate runs 210 simulations needing about"),
    (
        ["validate", "--profile", f"{D}/m-rows"],
        "measured.csv: more than 1,000 rows, above the limit of 1,000",
    ),
    (["diagnose", "--profile", f"{D}/m-fit"], "diagnose runs"),
    (
        ["calibrate", "fit", "--profile", f"{D}/m-fit", "--params", "cpu_iteration_ms", "--out", f"{D}/o14"],
        "fitting 1 parameter(s) runs",
    ),
]

CASES = FILE_CASES + SILENT_CASES + TRACEBACK_CASES + UNDEFINED_CASES + WORK_CASES


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


# ---- 4. every writer's output of one-token outputs read back by every reader -------------


def _strict_json(text: str) -> object:
    """JSON as a strict reader takes it: NaN or Infinity is an error."""
    import json

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _ok(args: list[str], capsys) -> str:
    from pipesim.cli import main

    main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "error" not in err, err
    return out


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_one_token_sweep_reads_back(suffix, tmp_path, capsys):
    """A sweep of one-token outputs (no request decodes: per-request speed and TPOT not
    defined) written as CSV or Parquet is read back by plot, search --from and --resume."""
    import pandas as pd

    from pipesim.base.files import read_table

    out = tmp_path / f"one{suffix}"
    one_token_sweep(out)
    capsys.readouterr()
    df = read_table(out)
    assert len(df) == 4 and df.per_request_tok_s.isna().all() and df.tpot_ms_p50.isna().all()
    assert (df.output_throughput_tok_s > 0).all() and (df.ttft_ms_p50 > 0).all()
    if suffix == ".csv":  # not defined: an empty cell, never the text 'nan'
        assert ",nan," not in out.read_text().lower()
    _ok(["plot", str(out), "--out-dir", str(tmp_path / "fig")], capsys)
    assert len(list((tmp_path / "fig").iterdir())) == 5
    text = _ok(["search", "--from", str(out), "--plot", str(tmp_path / "s.png")], capsys)
    assert "best: " in text and " nan" not in text.lower()
    text = _ok(["search", "--from", str(out), "--objective", "ttft", "--max-ttft-p99-ms", "1000"], capsys)
    assert "best: " in text
    one_token_sweep(out, "--resume")
    _, err = capsys.readouterr()
    assert "(4 kept from the file, 0 run)" in err or "(4 kept from the file, 0 run)" in _
    back = read_table(out)
    pd.testing.assert_frame_equal(back.drop(columns="sim_wall_s"), df.drop(columns="sim_wall_s"))


def test_one_token_json_outputs_are_strict_json(tmp_path, capsys):
    """Every JSON pipesim writes of one-token outputs is strict JSON, the figures that are
    not defined null: predict --json, --sensitivity --json, a trace, validate --json."""
    one = [*ONE, "--conc", "2", "--tp", "1", "--pp", "1"]
    r = _strict_json(_ok(["predict", *one, "--json"], capsys))
    assert r["per_request_tok_s"] is None and r["tpot_ms_p50"] is None and r["output_throughput_tok_s"] > 0
    s = _strict_json(_ok(["predict", *one, "--sensitivity", "--json"], capsys))
    assert all(i["swing_pct"]["per_request_tok_s"] is None for i in s["items"])
    assert any(i["swing_pct"]["output_throughput_tok_s"] for i in s["items"])
    _ok(["trace", "--out", str(tmp_path / "t.json"), *one], capsys)
    t = _strict_json((tmp_path / "t.json").read_text())
    assert t["traceEvents"] and t["otherData"]["output_throughput_tok_s"] > 0


def test_a_one_token_benchmark_imports_into_a_profile_that_loads(tmp_path, capsys):
    """SGLang bench_serving of one-token outputs (median TPOT written as 0: no request
    decoded) imports; the profile it writes loads and validates, its TPOT not defined."""
    import json

    from pipesim.profiles.profile import load_profile

    bench = tmp_path / "bench.jsonl"
    run = {"output_throughput": 50.0, "max_concurrency": 2, "completed": 10}
    run |= {
        "total_input_tokens": 160,
        "total_output_tokens": 10,
        "median_ttft_ms": 40.0,
        "median_tpot_ms": 0.0,
    }
    bench.write_text(json.dumps(run) + "\n")
    out = tmp_path / "prof"
    args = ["calibrate", "import", "bench", str(bench), "--profile", P, "--format", "sglang"]
    _ok([*args, "--tp", "1", "--pp", "8", "--out", str(out), "--model", "llama-3.1-8b"], capsys)
    point = [p for p in load_profile(out).measured if p.source.endswith("bench.jsonl")]
    assert len(point) == 1 and point[0].output_len == 1 and point[0].tpot_ms is None
    v = _strict_json(_ok(["validate", "--profile", str(out), "--json", "--max-error", "1000"], capsys))
    mine = [p for p in v["points"] if p["source"].endswith("bench.jsonl")]
    assert len(mine) == 1 and mine[0]["predicted"] > 0 and mine[0]["metric"] == "output_tok_s"


# ---- 5. bounds on memory and work, counted as a file streams in and before any run -------


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    lines=st.integers(0, 60),
    width=st.integers(0, 3000),
    max_rows=st.integers(1, 50),
    max_kib=st.integers(1, 64),
    packed=st.booleans(),
)
def test_a_bounded_read_stops_at_its_bound(lines, width, max_rows, max_kib, packed):
    """read_bounded returns the whole content when it is within both bounds, and is one
    UserError naming the file otherwise, having inflated no more than one chunk past the
    bound (the stream it reads is counted: a gzip bomb is never inflated whole)."""
    import gzip
    import io

    from pipesim.base.checks import read_bounded
    from pipesim.base.errors import UserError

    content = b"h\n" + (b"x" * width + b"\n") * lines
    raw = gzip.compress(content, compresslevel=1) if packed else content
    served = [0]

    class Counted(io.BytesIO):
        def read(self, n=-1):
            got = super().read(n)
            served[0] += len(got)
            return got

    origin = "t.csv.gz" if packed else "t.csv"
    within = len(content) <= max_kib * 1024 and content.count(b"\n") <= max_rows + 1
    try:
        got = read_bounded(Counted(raw), origin, max_kib * 1024, max_rows)
    except UserError as exc:
        assert not within and str(exc).startswith(origin) and "\n" not in str(exc)
    else:
        assert within and got == content
    assert served[0] <= len(raw)  # read no further than the file (and stopped at the bound)


def test_a_gzip_bomb_is_refused_within_its_bound(tmp_path):
    """A 2 GB table in a few MB of gzip: refused having inflated at most the bound and one
    chunk (counted on the decompressed stream; no timer, no RSS)."""
    import gzip

    from pipesim.base import checks
    from pipesim.base.errors import UserError

    bomb = tmp_path / "gemm.csv.gz"
    member = gzip.compress(b"0" * (1 << 24), compresslevel=9)  # 16 MiB of one line in 16 kB
    bomb.write_bytes(member * 128)  # 128 gzip members: 2 GiB in 2 MB
    assert bomb.stat().st_size < 4 * 2**20
    inflated = [0]
    real = gzip.GzipFile.read

    def counted(self, n=-1):
        got = real(self, n)
        inflated[0] += len(got)
        return got

    gzip.GzipFile.read = counted  # type: ignore[method-assign]
    try:
        with pytest.raises(UserError, match="more than 128 MiB once decompressed"):
            checks.read_bounded(bomb, str(bomb), checks.MAX_TABLE_BYTES, checks.MAX_TABLE_ROWS)
    finally:
        gzip.GzipFile.read = real  # type: ignore[method-assign]
    assert inflated[0] <= checks.MAX_TABLE_BYTES + (1 << 20)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    depth=st.integers(1, 80),
    split=st.integers(0, 80),
    extra=st.lists(st.integers(0, 79), max_size=6),
)
def test_box_paths_are_the_tree_paths(depth, split, extra):
    """A box whose two GPUs hang from two chains meeting `split` levels up (side branches
    besides): the path between them crosses each chain up to the meeting node and down the
    other, in order; a tree deeper than MAX_BOX_DEPTH is refused by name."""
    from pipesim.base.checks import MAX_BOX_DEPTH
    from pipesim.base.errors import UserError
    from pipesim.inputs.box import box_from_dict

    split = min(split, depth)
    chain = [f"s{i}" for i in range(depth)]
    a = ["gpu0"] + [f"a{i}" for i in range(split)]
    b = ["gpu1"] + [f"b{i}" for i in range(split)]
    links = [(x, y) for x, y in zip(a, a[1:] + [chain[split - 1] if split else chain[0]])]
    links += [(x, y) for x, y in zip(b, b[1:] + [chain[split - 1] if split else chain[0]])]
    links += list(zip(chain, chain[1:]))
    links += [(f"side{k}", chain[min(i, depth - 1)]) for k, i in enumerate(extra)]
    box = {
        "name": "t",
        "gpu": {"name": "g", "count": 2, "memory_bytes": 8e10, "mem_bw_bytes_s": 2e12, "flops_bf16": 4e14},
        "topology": {"links": [{"child": c, "parent": p, "bw_gb_s": 10, "latency_us": 1} for c, p in links]},
    }
    parent = dict(links)

    def below_top(n: str) -> int:
        return 0 if n not in parent else 1 + below_top(parent[n])

    deepest = max(below_top(n) for n in parent)
    try:
        bx = box_from_dict(box)
    except UserError as exc:
        assert "above the limit of" in str(exc) and deepest > MAX_BOX_DEPTH
        return
    assert deepest <= MAX_BOX_DEPTH
    meet = chain[split - 1] if split else chain[0]
    up = list(zip(a, a[1:] + [meet]))
    down = [(p, c) for c, p in reversed(list(zip(b, b[1:] + [meet])))]
    assert list(bx.path(0, 1)) == up + down
    assert bx.p2p_time_s(0, 1, 1e6) > 0


def test_a_box_at_the_depth_bound_answers(tmp_path, capsys):
    """60 switch levels (under MAX_BOX_DEPTH): a prediction over them runs."""
    (tmp_path / "deep.toml").write_text(deep_box(60))
    args = [
        "predict",
        "--box",
        str(tmp_path / "deep.toml"),
        "--tp",
        "2",
        "--conc",
        "1",
        *_fast,
        "--no-intervals",
    ]
    assert "output throughput" in _ok(args, capsys)

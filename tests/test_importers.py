"""Importers: nccl-tests and serving-benchmark outputs in real formats and malformed,
and importing into a profile through the CLI (merging, keeping the profile's other files)."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from pipesim.base.errors import UserError
from pipesim.cli import main
from pipesim.profiles.importers import bench, nccl_tests
from pipesim.profiles.measured import read_points
from pipesim.profiles.profile import load_profile

DATA = Path(__file__).parent / "data"


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def cli_ok(args, capsys):
    main(args)  # no SystemExit on success
    return capsys.readouterr().out


# ---- nccl-tests ---------------------------------------------------------------------


def test_nccl_tests_new_format():
    text = (DATA / "all_reduce_perf_8gpu.txt").read_text()
    df = nccl_tests.parse(text, "all_reduce_perf_8gpu.txt")
    assert set(df.op) == {"all_reduce"} and set(df.gpus) == {8}  # eight '#  Rank' lines
    # out-of-place time column, us -> ms, sizes in bytes as printed
    row = df[df.nbytes == 1048576].iloc[0]
    assert row.latency_ms == pytest.approx(80.12e-3)
    assert list(df.nbytes) == [4096, 16384, 65536, 262144, 1048576, 4194304]


def test_nccl_tests_old_format_without_root():
    # older versions print no test name: the file name tells the collective
    df = nccl_tests.parse((DATA / "all_gather_perf_old.txt").read_text(), "all_gather_perf_old.txt")
    assert set(df.op) == {"all_gather"} and set(df.gpus) == {4}
    assert df[df.nbytes == 65536].latency_ms.iloc[0] == pytest.approx(14.02e-3)


@pytest.mark.parametrize(
    "text, msg",
    [
        ("# nThread 1 nGpus 8\n", "cannot tell which collective"),
        ("# all_reduce_perf\n# nThread 1 nGpus 8\n", "no data rows"),
        ("# all_reduce_perf nGpus 8\n   4096 1024 float sum -1 abc 0 0 0 1 2 3 0\n", "time a number"),
        (
            "# all_reduce_perf nGpus 8\n   4096 1024 float sum -1 17.0 0 0\n",
            "bad.txt: line 2: expected 12 or 13 columns (size count type redop [root] time algbw busbw #wrong x2), got 8",
        ),
        ("# all_reduce_perf\n   4096 1024 float sum -1 17.8 0.2 0.4 0 17.6 0.2 0.4 0\n", "how many GPUs"),
    ],
)
def test_nccl_tests_malformed(text, msg):
    with pytest.raises(UserError, match=re.escape(msg)):
        nccl_tests.parse(text, "bad.txt")


# ---- benchmark outputs ---------------------------------------------------------------


def test_sglang_bench_serving_jsonl_with_infinity():
    df = bench.parse_sglang((DATA / "sglang_bench_serving.jsonl").read_text(), "s.jsonl", 8, 1)
    assert len(df) == 2
    first = df.iloc[0]
    assert first.conc == 32 and first.tok_s == 1155.2
    assert first.input_len == 256 and first.output_len == 300  # 16384/64, 19200/64
    assert first.ttft_ms == 598.0 and first.tpot_ms == 25.6  # medians
    pts = read_points(io.StringIO(df.to_csv(index=False)), "s.jsonl")
    assert [p.conc for p in pts] == [32, 1] and pts[0].engine == "sglang"


def test_vllm_bench_serve_json_with_inf_string():
    df = bench.parse_vllm((DATA / "vllm_bench_serve.json").read_text(), "v.json", 2, 4)
    row = df.iloc[0]
    assert (row.tp, row.pp, row.conc, row.tok_s) == (2, 4, 64, 932.0)
    assert row.engine == "vllm" and row.output_len == 300


def _appended(*records: dict) -> str:
    """What `vllm bench serve --append-result` leaves: each result's json.dump, a
    newline before every one but the first (vllm/benchmarks/serve.py)."""
    return "\n".join(json.dumps(r) for r in records)


def test_vllm_appended_results_with_metadata_split():
    base = json.loads((DATA / "vllm_bench_serve.json").read_text())
    text = _appended(
        {**base, "tp": "8", "pp": "1"},  # --metadata tp=8 pp=1: stored as text
        {
            **base,
            "max_concurrency": 8,
            "output_throughput": 300.0,
            "tensor_parallel_size": "2",
            "pp_size": "4",
        },
    )
    df = bench.parse_vllm(text, "v.json", None, None)
    assert list(zip(df.tp, df.pp, df.conc, df.tok_s)) == [(8, 1, 64, 932.0), (2, 4, 8, 300.0)]
    # the command line's split fills in a record without metadata, and agrees with one
    df = bench.parse_vllm(_appended(base, {**base, "tp": "2"}), "v.json", 2, 4)
    assert list(zip(df.tp, df.pp)) == [(2, 4), (2, 4)]


@pytest.mark.parametrize(
    "records, tp, msg",
    [
        ([{"tp": "8", "pp": "1"}], 4, "record 1 says tp=8 but --tp 4 was given"),
        ([{"tp": "8", "pp": "1"}, {}], None, "record 2 does not record its tp; pass --tp and --pp"),
        ([{"tp": "eight", "pp": "1"}], None, "tp = 'eight' must be a whole number"),
    ],
)
def test_vllm_metadata_split_refused(records, tp, msg):
    base = json.loads((DATA / "vllm_bench_serve.json").read_text())
    with pytest.raises(UserError, match=msg):
        bench.parse_vllm(
            _appended(*({**base, **r} for r in records)), "v.json", tp, None if tp is None else 1
        )


def test_vllm_appended_file_with_a_broken_line_names_it():
    base = (DATA / "vllm_bench_serve.json").read_text().strip()
    with pytest.raises(UserError, match="line 2 is not JSON"):
        bench.parse_vllm(base + "\n{broken", "v.json", 2, 4)


@pytest.mark.parametrize(
    "text, msg",
    [
        ('{"output_throughput": 10.0, "max_concurrency": 4}\nnot json\n', "line 2 is not JSON"),
        ('{"max_concurrency": 4}\n', "no positive output_throughput"),
        ('{"output_throughput": 10.0, "max_concurrency": null}\n', "no max_concurrency"),
        ("\n", "no results"),
    ],
)
def test_sglang_bench_malformed(text, msg):
    with pytest.raises(UserError, match=msg):
        bench.parse_sglang(text, "bad.jsonl", 8, 1)


# ---- importing into a profile through the CLI ---------------------------------------


@pytest.fixture
def small_profile(tmp_path):
    """A copy of the healthy profile's folder to import into."""
    from pipesim.profiles.profile import _profile_dir

    src = Path(str(_profile_dir("rtx-pro-6000-sglang-healthy")))
    dst = tmp_path / "prof"
    shutil.copytree(src, dst)
    return dst


def import_sglang_bench(profile_dir, capsys):
    """`calibrate import bench` of the two sample sglang bench_serving points, as TP8 x PP1."""
    sample = str(DATA / "sglang_bench_serving.jsonl")
    args = ["--profile", str(profile_dir), "--format", "sglang", "--tp", "8", "--pp", "1"]
    return cli_ok(["calibrate", "import", "bench", sample, *args], capsys)


def test_import_nccl_tests_replaces_that_group_only(small_profile, capsys):
    before = load_profile(small_profile).tables["collectives"]
    cli_ok(
        [
            "calibrate",
            "import",
            "nccl-tests",
            str(DATA / "all_reduce_perf_8gpu.txt"),
            "--profile",
            str(small_profile),
        ],
        capsys,
    )
    after = load_profile(small_profile).tables["collectives"]
    ar8 = after[(after.op == "all_reduce") & (after.impl == "nccl") & (after.gpus == 8)]
    assert list(ar8.nbytes) == [4096, 16384, 65536, 262144, 1048576, 4194304]
    untouched = before[(before.gpus == 4)]
    assert len(after[after.gpus == 4]) == len(untouched)


def test_import_bench_then_validate_exit_codes(small_profile, capsys):
    import_sglang_bench(small_profile, capsys)
    assert len(load_profile(small_profile).measured) == 2
    # these invented numbers are far from the tables' prediction: validate must fail them
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--profile", str(small_profile), "--max-error", "5", "--json"])
    assert exc.value.code == 1
    report = json.loads(capsys.readouterr().out)
    assert len(report["points"]) == 2 and report["mape_pct"] > 5


def test_import_bench_needs_the_split(small_profile, capsys):
    code, out, err = run_cli(
        [
            "calibrate",
            "import",
            "bench",
            str(DATA / "vllm_bench_serve.json"),
            "--profile",
            str(small_profile),
            "--format",
            "vllm",
        ],
        capsys,
    )
    assert code == 2 and "--tp and --pp" in err and len(err.strip().splitlines()) == 1


def test_rewriting_a_profile_keeps_its_other_files_and_measured_latencies(small_profile, capsys):
    """An import rewrites the profile: files it does not parse (a box.toml, logs) and
    the TTFT/TPOT of earlier points must survive."""
    (small_profile / "box.toml").write_text("# a box beside the profile\n")
    (small_profile / "run.log").write_text("measured\n")
    for _ in range(2):  # the second import rewrites the points the first one wrote
        import_sglang_bench(small_profile, capsys)
    assert (small_profile / "box.toml").read_text() == "# a box beside the profile\n"
    assert (small_profile / "run.log").is_file()
    points = load_profile(small_profile).measured
    assert len(points) == 4
    assert [p.ttft_ms for p in points] == [598.0, 151.2, 598.0, 151.2]  # the samples' median_ttft_ms


# ---- AIConfigurator, the nested layout aiconfigurator-core ships --------------------


def _parquet(path: Path, rows: dict, version: str | None = None) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    if version is not None:
        (path.parent / "collection_meta.yaml").write_text(f"framework: vllm\nversion: '{version}'\n")


@pytest.fixture
def nested_system(tmp_path):
    """A tiny <system>/<op>/<engine>/<version>/<table>.parquet tree: a GEMM measured
    by two vLLM versions (different latencies), NCCL and the custom all-reduce."""
    pytest.importorskip("pyarrow")
    root = tmp_path / "h100_sxm"
    for version, ms in (("0.19.0", 0.010), ("0.24.0", 0.020)):
        _parquet(
            root / "gemm" / "vllm" / version / "gemm_perf.parquet",
            {
                "kernel_source": ["vllm_default"] * 2,
                "gemm_dtype": ["bfloat16"] * 2,
                "m": [1, 8],
                "n": [4096, 4096],
                "k": [4096, 4096],
                "latency": [ms, 2 * ms],
            },
            version,
        )
    comm = {"op_name": ["all_reduce"] * 2, "num_gpus": [2, 2], "message_size": [1024, 4096]}
    _parquet(
        root / "comm" / "nccl" / "2.29.2" / "nccl_perf.parquet",
        {**comm, "nccl_dtype": ["half"] * 2, "latency": [0.008, 0.009]},
    )
    _parquet(
        root / "comm" / "vllm" / "0.24.0" / "custom_allreduce_perf.parquet",
        {
            **comm,
            "backend": ["custom_graph"] * 2,
            "allreduce_dtype": ["bfloat16"] * 2,
            "latency": [0.004, 0.005],
        },
        "0.24.0",
    )
    return root


def test_nested_layout_reads_the_newest_version_and_says_which(nested_system):
    from pipesim.profiles.importers.aiconfigurator import build_tables

    versions: dict = {}
    tables = build_tables(nested_system, kernel_set="vllm", versions=versions)
    assert list(tables["gemm"].latency_ms) == [0.020, 0.040]  # the 0.24.0 rows, in ms as stored
    assert versions["gemm"] == "vllm 0.24.0 gemm_perf"
    coll = tables["collectives"]
    # message_size counts 2-byte elements: 1024 -> 2048 bytes; NCCL and the custom kernel both kept
    assert sorted(zip(coll.impl, coll.nbytes, coll.latency_ms)) == [
        ("custom", 2048, 0.004),
        ("custom", 8192, 0.005),
        ("nccl", 2048, 0.008),
        ("nccl", 8192, 0.009),
    ]
    assert "moe" not in tables  # not measured: left out, not an error


def test_import_aiconfigurator_engine_version_picks_the_older_tables(nested_system, tmp_path, capsys):
    out = tmp_path / "prof"
    args = ["calibrate", "import", "aiconfigurator", str(nested_system), "--out", str(out)]
    cli_ok([*args, "--kernel-set", "vllm", "--box", "h100-sxm-8x", "--engine-version", "0.19.0"], capsys)
    p = load_profile(out)
    assert p.engine_version == "0.19.0" and list(p.tables["gemm"].latency_ms) == [0.010, 0.020]
    assert "vllm 0.19.0 gemm_perf" in p.sources["gemm"]
    code, _, err = run_cli(
        [
            *args[:-1],
            str(tmp_path / "p2"),
            "--kernel-set",
            "vllm",
            "--box",
            "h100-sxm-8x",
            "--engine-version",
            "0.20.0",
        ],
        capsys,
    )
    assert (
        code == 2 and "no vllm kernel tables at version 0.20.0; nothing to import" in err
    )  # docs/bad-input.md


def test_nested_layout_refuses_a_folder_whose_meta_names_another_version(nested_system):
    from pipesim.profiles.importers.aiconfigurator import build_tables

    meta = nested_system / "gemm" / "vllm" / "0.24.0" / "collection_meta.yaml"
    meta.write_text("framework: vllm\nversion: 0.23.0\n")
    with pytest.raises(UserError, match="says version 0.23.0, but its folder is 0.24.0"):
        build_tables(nested_system, kernel_set="vllm")


def test_a_custom_table_naming_no_backend_is_not_the_engines_kernel(nested_system):
    """AIConfigurator files TRT-LLM's own all-reduce under some SGLang versions, without the
    `backend` column that names the engine's CUDA-graph kernel: none of it is read as the
    engine's custom all-reduce, and NCCL's rows stand alone."""
    from pipesim.profiles.importers.aiconfigurator import build_tables

    _parquet(
        nested_system / "comm" / "vllm" / "0.19.0" / "custom_allreduce_perf.parquet",
        {
            "op_name": ["all_reduce"] * 2,
            "num_gpus": [2, 2],
            "message_size": [1024, 4096],
            "kernel_source": ["TRTLLM"] * 2,
            "allreduce_dtype": ["bfloat16"] * 2,
            "latency": [0.001, 0.002],
        },
        "0.19.0",
    )
    coll = build_tables(nested_system, kernel_set="vllm", version="0.19.0")["collectives"]
    assert sorted(zip(coll.impl, coll.nbytes, coll.latency_ms)) == [
        ("nccl", 2048, 0.008),
        ("nccl", 8192, 0.009),
    ]

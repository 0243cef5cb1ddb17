"""Calibration: importers on real-format samples and malformed files, profile checks,
fitting (recovering a planted parameter), validation and diagnosis."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from pipesim.calibrate.importers import bench, nccl_tests
from pipesim.calibrate.measured import Point, read_points
from pipesim.cli import main
from pipesim.errors import UserError
from pipesim.profile import load_profile, read_table

DATA = Path(__file__).parent / "data"
DEPLOYMENT = "rtx-pro-6000-sglang-deployment"


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


@pytest.mark.parametrize("text, msg", [
    ("# nThread 1 nGpus 8\n", "cannot tell which collective"),
    ("# all_reduce_perf\n# nThread 1 nGpus 8\n", "no data rows"),
    ("# all_reduce_perf nGpus 8\n   4096 1024 float sum -1 abc 0 0 0 1 2 3 0\n", "time a number"),
    ("# all_reduce_perf nGpus 8\n   4096 1024 float sum -1 17.0 0 0\n",
     "bad.txt: line 2: expected 12 or 13 columns (size count type redop [root] time algbw busbw #wrong x2), got 8"),
    ("# all_reduce_perf\n   4096 1024 float sum -1 17.8 0.2 0.4 0 17.6 0.2 0.4 0\n", "how many GPUs"),
])
def test_nccl_tests_malformed(text, msg):
    with pytest.raises(UserError, match=re.escape(msg)):
        nccl_tests.parse(text, "bad.txt")


# ---- benchmark outputs ---------------------------------------------------------------

def test_sglang_bench_serving_jsonl_with_infinity():
    df = bench.parse_sglang((DATA / "sglang_bench_serving.jsonl").read_text(), "s.jsonl", 8, 1)
    assert len(df) == 2
    first = df.iloc[0]
    assert first.conc == 32 and first.tok_s == 1155.2
    assert first.input_len == 256 and first.output_len == 300      # 16384/64, 19200/64
    assert first.ttft_ms == 598.0 and first.tpot_ms == 25.6        # medians
    pts = read_points(io.StringIO(df.to_csv(index=False)), "s.jsonl")
    assert [p.conc for p in pts] == [32, 1] and pts[0].engine == "sglang"


def test_vllm_bench_serve_json_with_inf_string():
    df = bench.parse_vllm((DATA / "vllm_bench_serve.json").read_text(), "v.json", 2, 4)
    row = df.iloc[0]
    assert (row.tp, row.pp, row.conc, row.tok_s) == (2, 4, 64, 932.0)
    assert row.engine == "vllm" and row.output_len == 300


@pytest.mark.parametrize("text, msg", [
    ('{"output_throughput": 10.0, "max_concurrency": 4}\nnot json\n', "line 2 is not JSON"),
    ('{"max_concurrency": 4}\n', "no positive output_throughput"),
    ('{"output_throughput": 10.0, "max_concurrency": null}\n', "no max_concurrency"),
    ("\n", "no results"),
])
def test_sglang_bench_malformed(text, msg):
    with pytest.raises(UserError, match=msg):
        bench.parse_sglang(text, "bad.jsonl", 8, 1)


@pytest.mark.parametrize("csv, msg", [
    ("tp,pp,conc\n8,1,1\n", "missing column"),
    ("tp,pp,conc,tok_s\n8,1,x,26\n", "line 2, column conc"),
    ("tp,pp,conc,tok_s\n8,1,1,-3\n", "must be > 0"),
    ("tp,pp,conc,tok_s,tok_s_lo,tok_s_hi\n8,1,1,26,30,40\n", "tok_s_lo <= tok_s"),
    ("tp,pp,conc,tok_s,metric\n8,1,1,26,latency\n", "column metric"),
    ("tp,pp,conc,tok_s,color\n8,1,1,26,red\n", "unknown column"),
    ("tp,pp,conc,tok_s,disable_cuda_graph\n8,1,1,26,maybe\n", "true or false"),
])
def test_measured_csv_malformed(csv, msg):
    with pytest.raises(UserError, match=msg):
        read_points(io.StringIO(csv), "m.csv")


def test_band_error_is_zero_inside_and_relative_to_the_nearer_edge():
    p = Point("", "kimi-k2.6", "sglang", 8, 1, 32, 256, 300, "output_tok_s", 578, 808, (), "")
    assert p.error(700) == 0.0
    assert p.error(520.2) == pytest.approx((520.2 - 578) / 578)
    assert p.error(888.8) == pytest.approx((888.8 - 808) / 808)


# ---- profile tables ----------------------------------------------------------------

@pytest.mark.parametrize("csv, msg", [
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,0.01\nbf16,2,32,32\n", "line 3, column latency_ms"),
    ("dtype,m,n,k\nbf16,1,32,32\n", "missing column"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,nan\n", "line 2, column latency_ms"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,-0.5\n", "latency > 0"),
    ("dtype,m,n,k,latency_ms\nbf16,0,32,32,0.5\n", "line 2, column m"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,0.5\nbf16,1,32,32,0.6\n", "line 3: sizes must not repeat"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,2e-6\nbf16,2,32,32,3e-6\n", "not seconds"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,2000\nbf16,2,32,32,3000\n", "not microseconds"),
])
def test_malformed_tables_name_file_line_column(csv, msg):
    with pytest.raises(UserError, match=msg):
        read_table(io.StringIO(csv), "gemm", "gemm.csv")


def test_shipped_profiles_and_their_provenance(capsys):
    out = cli_ok(["profiles", "list"], capsys)
    for name in (DEPLOYMENT, "rtx-pro-6000-sglang-healthy", "rtx-pro-6000-vllm"):
        assert name in out
        prof = load_profile(name)
        assert set(prof.sources) == set(prof.tables)          # every table names its source
    dep = load_profile(DEPLOYMENT)
    assert len(dep.measured) == 3 and dep.deployment["max_running_requests"] == 64
    healthy = load_profile("rtx-pro-6000-sglang-healthy")
    assert healthy.params.allreduce_scale == 1.0 and healthy.params.allreduce_offset_us == 0.0


# ---- importing into a profile through the CLI ---------------------------------------

@pytest.fixture
def small_profile(tmp_path):
    """A copy of the healthy profile's folder to import into."""
    from pipesim.profile import _profile_dir

    src = Path(str(_profile_dir("rtx-pro-6000-sglang-healthy")))
    dst = tmp_path / "prof"
    shutil.copytree(src, dst)
    return dst


def test_import_nccl_tests_replaces_that_group_only(small_profile, capsys):
    before = load_profile(small_profile).tables["collectives"]
    cli_ok(["calibrate", "import", "nccl-tests", str(DATA / "all_reduce_perf_8gpu.txt"), "--profile", str(small_profile)],
           capsys)
    after = load_profile(small_profile).tables["collectives"]
    ar8 = after[(after.op == "all_reduce") & (after.impl == "nccl") & (after.gpus == 8)]
    assert list(ar8.nbytes) == [4096, 16384, 65536, 262144, 1048576, 4194304]
    untouched = before[(before.gpus == 4)]
    assert len(after[after.gpus == 4]) == len(untouched)


def test_import_bench_then_validate_exit_codes(small_profile, capsys):
    cli_ok(["calibrate", "import", "bench", str(DATA / "sglang_bench_serving.jsonl"), "--profile", str(small_profile),
            "--format", "sglang", "--tp", "8", "--pp", "1"], capsys)
    assert len(load_profile(small_profile).measured) == 2
    # these invented numbers are far from the tables' prediction: validate must fail them
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--profile", str(small_profile), "--max-error", "5", "--json"])
    assert exc.value.code == 1
    report = json.loads(capsys.readouterr().out)
    assert len(report["points"]) == 2 and report["mape_pct"] > 5


def test_import_bench_needs_the_split(small_profile, capsys):
    code, out, err = run_cli(["calibrate", "import", "bench", str(DATA / "vllm_bench_serve.json"),
                              "--profile", str(small_profile), "--format", "vllm"], capsys)
    assert code == 2 and "--tp and --pp" in err and len(err.strip().splitlines()) == 1


def test_validate_default_profile_within_10_percent(capsys):
    cli_ok(["validate", "--max-error", "10"], capsys)  # exit 0: every reference point within 10%


# ---- fitting ----------------------------------------------------------------------

def test_fit_recovers_a_planted_parameter():
    """Measure with a known CPU cost per iteration, then fit it back from zero."""
    from pipesim.calibrate.fit import fit, predict_point

    prof = load_profile("rtx-pro-6000-sglang-healthy").with_params(cpu_iteration_ms=0.0, eager_launch_us_per_layer=0.0)
    planted = prof.with_params(cpu_iteration_ms=4.0)
    points = []
    for conc in (1, 4):
        p = Point(f"C={conc}", "llama-3.1-8b", "sglang", 1, 1, conc, 64, 24, "output_tok_s", 1, 1, (), "")
        v = predict_point(planted, p)
        points.append(Point(p.name, p.model, p.engine, 1, 1, conc, 64, 24, "output_tok_s", v, v, (), "planted"))
    r = fit(prof, ["cpu_iteration_ms"], points)
    assert r.params["cpu_iteration_ms"] == pytest.approx(4.0, rel=0.02)
    assert r.mape < 1.0 and all(e is not None and abs(e) < 0.02 for e in r.loo_errors)


# ---- diagnosis ------------------------------------------------------------------------

def test_diagnosis_of_the_reference_deployment():
    """TP8 C=1 ran at 26.3 tok/s where the tables give ~100: charged to all-reduce alone,
    each of the 123 per step must cost (1/26.3 - 1/tables) / 123 more than the table;
    that cause cannot also explain TP8 C=32, while a CPU launch bound explains all."""
    from pipesim.calibrate.diagnose import diagnose

    d = diagnose(load_profile(DEPLOYMENT))
    tp8 = next(x for x in d.points if x.point.tp == 8 and x.point.conc == 1)
    assert tp8.allreduces_per_step == 2 * 61 + 1
    extra_us = (1 / 26.3 - 1 / tp8.tables_only) / tp8.allreduces_per_step * 1e6
    assert tp8.needed["allreduce_offset_us"] == pytest.approx(extra_us, rel=0.05)
    assert (tp8.allreduce_table_us + extra_us) / tp8.allreduce_table_us > 5   # far slower than the NCCL table
    assert d.consistency["eager_launch_us_per_layer"][1] <= 10
    assert d.consistency["allreduce_offset_us"][1] > 10
    assert "ruled out" in d.text() and "NCCL table" in d.text()


def test_rewriting_a_profile_keeps_its_other_files_and_measured_latencies(small_profile, capsys):
    """An import rewrites the profile: files it does not parse (a box.toml, logs) and
    the TTFT/TPOT of earlier points must survive."""
    (small_profile / "box.toml").write_text("# a box beside the profile\n")
    (small_profile / "run.log").write_text("measured\n")
    for _ in range(2):   # the second import rewrites the points the first one wrote
        cli_ok(["calibrate", "import", "bench", str(DATA / "sglang_bench_serving.jsonl"), "--profile",
                str(small_profile), "--format", "sglang", "--tp", "8", "--pp", "1"], capsys)
    assert (small_profile / "box.toml").read_text() == "# a box beside the profile\n"
    assert (small_profile / "run.log").is_file()
    points = load_profile(small_profile).measured
    assert len(points) == 4
    assert [p.ttft_ms for p in points] == [598.0, 151.2, 598.0, 151.2]   # the samples' median_ttft_ms

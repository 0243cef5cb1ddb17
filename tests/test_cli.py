"""The command line: --json output, and bad input -> one line on stderr, exit code 2."""

import json
import subprocess
import sys

import pytest

from pipesim.base.errors import UserError
from pipesim.base.files import read_table
from pipesim.cli import cli, main
from pipesim.cli.options import parse_ints

JSON_KEYS = {
    "output_throughput_tok_s",
    "request_throughput_req_s",
    "per_request_tok_s",
    "ttft_ms_mean",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_mean",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "bubble_fraction",
    "stage_busy_fraction",
    "allreduce_share",
    "sim_events",
    "sim_wall_s",
    "scenario",
}

SMALL = ["--model", "llama-3.1-8b", "--conc", "2", "--output-len", "12", "--input-len", "64"]


def run_ok(capsys, args):
    main(args)  # success returns normally (no SystemExit)
    out, err = capsys.readouterr()
    return out, err


@pytest.mark.parametrize("tp,pp", [(2, 2), (8, 1), (1, 4)])
def test_predict_json(capsys, tp, pp):
    out, err = run_ok(capsys, ["predict", "--tp", str(tp), "--pp", str(pp), *SMALL, "--json"])
    d = json.loads(out)  # exactly one JSON object, nothing else on stdout
    assert isinstance(d, dict)
    assert JSON_KEYS <= set(d)
    assert isinstance(d["stage_busy_fraction"], list) and len(d["stage_busy_fraction"]) == pp
    assert all(0 <= b <= 1 for b in d["stage_busy_fraction"])
    assert 0 <= d["bubble_fraction"] <= 1
    # bubble = mean idle share of the stages = 1 - mean busy share (busy <= 1)
    assert d["bubble_fraction"] == pytest.approx(1 - sum(d["stage_busy_fraction"]) / pp, abs=1e-5)
    assert d["scenario"]["tp"] == tp and d["scenario"]["pp"] == pp
    assert d["scenario"]["model"] == "llama-3.1-8b"
    assert d["output_throughput_tok_s"] > 0 and d["ttft_ms_p50"] > 0 and d["tpot_ms_p50"] > 0
    assert d["ttft_ms_p50"] <= d["ttft_ms_p99"] and d["tpot_ms_p50"] <= d["tpot_ms_p99"]
    # all-reduce only with TP
    assert (d["allreduce_share"] > 0) == (tp > 1)
    assert isinstance(d["sim_events"], int) and d["sim_events"] > 0


def test_predict_table(capsys):
    out, _ = run_ok(capsys, ["predict", "--tp", "2", "--pp", "2", *SMALL])
    assert "output throughput" in out and "TP2 x PP2" in out


def test_vllm_engine_json(capsys):
    out, _ = run_ok(capsys, ["predict", "--engine", "vllm", "--tp", "2", "--pp", "2", *SMALL, "--json"])
    d = json.loads(out)
    assert d["scenario"]["engine"]["engine"] == "vllm"
    assert d["scenario"]["engine"]["max_concurrent_batches"] == 2


@pytest.fixture
def two_layer_config(tmp_path):
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "two" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return str(path)


BAD = {
    "tp_x_pp_over_8": (["--tp", "4", "--pp", "4", "--conc", "1"], "8"),
    "tp_not_dividing_heads": (["--tp", "3", "--conc", "1"], "64"),
    "does_not_fit": (["--tp", "1", "--pp", "1", "--conc", "1"], "fit"),
    "conc_zero": (["--tp", "8", "--conc", "0"], "concurrency"),
    "no_load": (["--tp", "8"], "--conc"),
    "unknown_model": (["--model", "no-such-model", "--tp", "8", "--conc", "1"], "kimi-k2.6"),
    "unknown_profile": (
        ["--profile", "no-such-profile", "--tp", "8", "--conc", "1"],
        "rtx-pro-6000-sglang-healthy",
    ),
    "non_numeric_tp": (["--tp", "two", "--conc", "1"], "--tp"),
    "bad_layers": (["--tp", "1", "--pp", "8", "--layers", "7,7,7,8,8,8,8,7", "--conc", "1"], "61"),
    "bad_output_len": (["--tp", "8", "--conc", "1", "--output-len", "x"], "output length"),
    "conc_and_rate": (["--tp", "8", "--conc", "1", "--rate", "2"], "concurrency"),
    "unknown_option": (["--tp", "8", "--conc", "1", "--no-such-flag"], "no-such-flag"),
    "missing_trace": (["--tp", "8", "--trace", "/nonexistent/trace.csv"], "trace"),
}


def expect_bad_input(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert needle in lines[0]
    assert out == ""


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_one_line_exit_2(capsys, name):
    args, needle = BAD[name]
    expect_bad_input(capsys, ["predict", *args], needle)


def test_pp_more_than_layers(capsys, two_layer_config):
    expect_bad_input(capsys, ["predict", "--model", two_layer_config, "--pp", "4", "--conc", "1"], "layers")


def test_unknown_model_lists_presets(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--model", "no-such-model", "--conc", "1"])
    err = capsys.readouterr().err
    for name in ("kimi-k2.6", "deepseek-v3", "llama-3.1-70b", "llama-3.1-8b"):
        assert name in err


def test_non_numeric_config_value(capsys, tmp_path):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": "abc",
                "intermediate_size": 4096,
                "num_attention_heads": 16,
                "vocab_size": 32000,
            }
        )
    )
    expect_bad_input(capsys, ["predict", "--model", str(path), "--conc", "1"], "hidden_size")


def test_rate_with_zero_requests(capsys):
    expect_bad_input(
        capsys,
        ["predict", "--model", "llama-3.1-8b", "--rate", "2", "--num-requests", "0", "--output-len", "5"],
        "number of requests",
    )


def test_console_script_exit_code():
    # the real process: exit status 2, one line on stderr, no traceback
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pipesim.cli import main; main()",
            "predict",
            "--tp",
            "4",
            "--pp",
            "4",
            "--conc",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


# ---- sweep and search ----------------------------------------------------------------------

# ---- the command line ---------------------------------------------------------------------


def test_cli_sweep_writes_a_table_and_search_reads_it(tmp_path, capsys):
    out = tmp_path / "r.csv"
    main(
        [
            "sweep",
            "--gpus",
            "8",
            "--conc",
            "1,8",
            "--input-len",
            "64",
            "--output-len",
            "40",
            "--workers",
            "2",
            "--out",
            str(out),
            "--progress",
        ]
    )
    cap = capsys.readouterr()
    assert "TP1 x PP8" in cap.out and "TP8 x PP1" in cap.out and "*" in cap.out
    assert "8 points in" in cap.out
    assert "8/8" in cap.err  # the progress bar went to stderr
    df = read_table(out)
    assert len(df) == 8
    main(["search", "--from", str(out), "--objective", "throughput", "--max-ttft-p99-ms", "100000"])
    text = capsys.readouterr().out
    assert "best:" in text and "why:" in text and "ranked" in text
    # the SLO flags, max-load, a subset of splits and the Pareto figure (its folder made)
    fig = tmp_path / "figs" / "pareto.png"
    limit = str(float(df.tpot_ms_p99.max()) + 1)  # every point meets it: each split carries C=8
    main(
        [
            "search",
            "--from",
            str(out),
            "--objective",
            "max-load",
            "--max-tpot-p99-ms",
            limit,
            "--splits",
            "2x4,8x1",
            "--plot",
            str(fig),
        ]
    )
    text = capsys.readouterr().out
    ranked = [line.split() for line in text.splitlines() if line.strip()[:2] in ("1 ", "2 ")]
    assert {" ".join(r[1:4]) for r in ranked} == {"TP2 x PP4", "TP8 x PP1"} and all(
        r[4] == "C=8" for r in ranked
    )
    assert "every load swept qualifies" in text and fig.is_file()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["sweep", "--gpus", "4"], "no valid TP x PP split for 4 GPUs"),
        (["sweep", "--conc", ""], "--conc is empty"),
        (["sweep", "--conc", "1,two"], "--conc '1,two'"),
        (["sweep", "--out", "/nonexistent-dir/r.csv"], "does not exist"),
        (["sweep", "--out", "r.xlsx"], "must end in .csv or .parquet"),
        (["sweep", "--seed", "x"], "'--seed': 'x' is not a valid integer"),
        (
            ["sweep", "--max-running-requests", "many"],
            "'--max-running-requests': 'many' is not a valid integer",
        ),
        (["search", "--objective", "fastest"], "unknown objective 'fastest'"),
        (["search", "--min-per-request-tok-s", "fast"], "--min-per-request-tok-s 'fast' is not a number"),
        (["search", "--from", "/nonexistent-dir/r.csv"], "does not exist"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main([*args, "--output-len", "20"] if args[0] == "sweep" else args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error:") and err.count("\n") == 1 and needle in err


def test_parse_ints():
    assert parse_ints("8, 2,8 ,4", "--gpus") == [2, 4, 8]
    for text, needle in [
        ("", "--gpus is empty"),
        ("2,x", "--gpus '2,x' must be comma-separated"),
        ("0", "--gpus: 0 is not a whole number >= 1"),
    ]:
        with pytest.raises(UserError, match=needle):
            parse_ints(text, "--gpus")


def test_defaults_shown_come_from_their_modules():
    from click.testing import CliRunner

    from pipesim.explore.sweep import DEFAULT_CONC
    from pipesim.inputs.workload import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN
    from pipesim.profiles.profile import DEFAULT_PROFILE
    from pipesim.scenario.build import DEFAULT_MODEL

    text = " ".join(CliRunner().invoke(cli, ["sweep", "--help"], terminal_width=200).output.split())
    for value in (
        DEFAULT_MODEL,
        DEFAULT_PROFILE,
        DEFAULT_INPUT_LEN,
        DEFAULT_OUTPUT_LEN,
        ",".join(map(str, DEFAULT_CONC)),
    ):
        assert f"default: {value}]" in text


# ---- expert and data parallel flags (docs/parallel.md) ----------------------------------


@pytest.mark.parametrize(
    "flags",
    [["--ep", "8"], ["--ep-size", "8"], ["--expert-parallel-size", "8"], ["--enable-expert-parallel"]],
)
def test_ep_flag_aliases(capsys, flags):
    # SGLang's names (--ep-size, --expert-parallel-size) and vLLM's --enable-expert-parallel
    # (with SGLang: ep = tp) all give EP8 at tp 8
    base = ["predict", "--tp", "8", "--conc", "1", "--output-len", "8", "--no-intervals", "--json"]
    d = json.loads(run_ok(capsys, [*base, *flags])[0])
    assert (d["scenario"]["ep"], d["scenario"]["moe_tp"], d["scenario"]["attn_tp"]) == (8, 1, 8)


@pytest.mark.parametrize("flag", ["--dp", "--data-parallel-size", "--dp-size"])
def test_dp_flag_aliases_reach_the_plan(capsys, flag):
    # each name reaches the plan's rule: SGLang DP attention needs dp | tp
    expect_bad_input(
        capsys, ["predict", "--tp", "8", flag, "3", "--enable-dp-attention", "--conc", "1"], "dp=3"
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--tp", "8", "--ep", "3", "--conc", "1"], "divisor of 8"),
        (["--tp", "8", "--dp", "3", "--enable-dp-attention", "--conc", "1"], "must divide tp=8"),
        (["--tp", "8", "--ep", "2", "--model", "llama-3.1-8b", "--conc", "1"], "mixture-of-experts"),
        (["--tp", "8", "--moe-a2a-backend", "deepep", "--conc", "1"], "--ep > 1"),
        (["--tp", "8", "--ep", "8", "--moe-a2a-backend", "nvlink", "--conc", "1"], "not known"),
        (["--tp", "8", "--ep", "8", "--moe-distribution", "zipf", "--conc", "1"], "--moe-distribution"),
        (
            [
                "--engine",
                "vllm",
                "--tp",
                "2",
                "--dp",
                "2",
                "--ep",
                "2",
                "--conc",
                "1",
                "--model",
                "qwen3-30b-a3b",
            ],
            "allowed: 1 or 4",
        ),
    ],
)
def test_bad_parallel_flags(capsys, args, needle):
    expect_bad_input(capsys, ["predict", *args], needle)


def test_cli_search_sweeps_expert_parallel_splits(capsys):
    # search runs the sweep it ranks, so the sweep's --enable-expert-parallel reaches it:
    # the split it names is the EP plan (SGLang: ep = tp, docs/parallel.md)
    main(
        [
            "search",
            "--gpus",
            "8",
            "--splits",
            "8x1",
            "--conc",
            "2",
            "--input-len",
            "64",
            "--output-len",
            "12",
            "--workers",
            "1",
            "--enable-expert-parallel",
            "--objective",
            "throughput",
        ]
    )
    text = capsys.readouterr().out
    assert "best: TP8 x PP1 x EP8" in text

"""Bad input, across every command: exit code 2, one line on stderr naming the
problem, no traceback, no output file left behind. docs/bad-input.md lists the same
cases; a test keeps the two in step."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from pipesim.cli import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "bad-input.md"
FAST = ["--model", "llama-3.1-8b", "--output-len", "8", "--input-len", "16"]


@pytest.fixture
def files(tmp_path):
    """Broken inputs of every kind, written fresh for each test."""
    from pipesim.profiles.profile import _profile_dir

    t = tmp_path
    (t / "bad.json").write_text("{not json")
    (t / "nonnum").mkdir()
    (t / "nonnum" / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": "many",
                "hidden_size": 1024,
                "num_attention_heads": 8,
                "intermediate_size": 4096,
                "vocab_size": 1000,
            }
        )
    )
    (t / "tiny").mkdir()
    (t / "tiny" / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 4,
                "hidden_size": 1024,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "intermediate_size": 4096,
                "vocab_size": 1000,
            }
        )
    )
    (t / "trace_cols.csv").write_text("arrival,input_tokens,output_tokens\n0,10,10\n")
    (t / "trace_neg.csv").write_text("arrival_s,input_tokens,output_tokens\n0,10,10\n-1,5,5\n")
    (t / "trace_zero.csv").write_text("arrival_s,input_tokens,output_tokens\n0,0,10\n")
    src = Path(str(_profile_dir("rtx-pro-6000-sglang-healthy")))

    def broken(name, table, text):
        d = t / name
        shutil.copytree(src, d)
        with gzip.open(d / f"{table}.csv.gz", "wt") as fh:
            fh.write(text)
        return d

    broken(
        "trunc",
        "collectives",
        "op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,0.02\nall_reduce,nccl,8",
    )
    broken("nocol", "collectives", "op,impl,gpus,latency_ms\nall_reduce,nccl,8,0.02\n")
    broken("nan", "collectives", "op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,nan\n")
    broken("neg", "collectives", "op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,-0.02\n")
    broken(
        "dup",
        "collectives",
        "op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,0.02\nall_reduce,nccl,8,256,0.03\n",
    )
    broken(
        "seconds",
        "collectives",
        "op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,2e-5\nall_reduce,nccl,8,512,3e-5\n",
    )
    shutil.copytree(src, t / "badparam")
    toml = (
        (t / "badparam" / "profile.toml")
        .read_text()
        .replace('"cpu_iteration_ms" = 0', '"cpu_iteration_ms" = -1', 1)
    )
    (t / "badparam" / "profile.toml").write_text(toml)
    shutil.copytree(src, t / "nopoints")
    (t / "empty").mkdir()
    (t / "unreadable.txt").write_text("# all_reduce_perf\n# nothing\n")
    gpu = '[gpu]\nname = "g"\ncount = COUNT\nmemory_bytes = 1e10\nmem_bw_bytes_s = BW\nflops_bf16 = 1e14\n'

    def box(name, links, count="2", bw="1e12"):
        body = ",\n".join(
            f'{{ child = "{c}", parent = "{p}", bw_gb_s = {b}, latency_us = 1 }}' for c, p, b in links
        )
        (t / f"{name}.toml").write_text(
            gpu.replace("COUNT", count).replace("BW", bw) + f"[topology]\nlinks = [\n{body}\n]\n"
        )

    box("cycle", [("gpu0", "a", 1), ("gpu1", "a", 1), ("a", "b", 1), ("b", "a", 1)])
    box("twoparents", [("gpu0", "a", 1), ("gpu1", "a", 1), ("gpu1", "b", 1)])
    box("negbw", [("gpu0", "a", 1), ("gpu1", "a", -5)])
    box("unreach", [("gpu0", "a", 1), ("gpu1", "b", 1)])
    box("strcount", [("gpu0", "a", 1), ("gpu1", "a", 1)], count='"two"')
    box("infbw", [("gpu0", "a", 1), ("gpu1", "a", 1)], bw="inf")
    box("gpu9", [("gpu0", "a", 1), ("gpu1", "a", 1), ("gpu9", "a", 1)])
    (t / "badnet.toml").write_text(
        (t / "cycle.toml").read_text().split("[topology]")[0]
        + '[topology]\nlinks = [{ child = "gpu0", parent = "a", bw_gb_s = 1, latency_us = 1 }, '
        '{ child = "gpu1", parent = "a", bw_gb_s = 1, latency_us = 1 }]\n'
        '[network]\nname = "n"\nnic_gb_s = 0\nlatency_us = 2\n'
    )
    return t


def predict_case(*flags, says):
    """A case of predict with one client of the short Llama-8B requests and `flags`."""
    return ["predict", "--conc", "1", *flags, *FAST], says, None


# (args, what the one line must mention, a file that must not be left behind)
CASES = [
    (["predict", "--tp", "3", "--pp", "4", "--conc", "1"], "tp x pp = 3 x 4 = 12 GPUs", None),
    (["predict", "--tp", "0", "--conc", "1"], "tp must be a whole number >= 1", None),
    (["predict", "--pp", "-2", "--conc", "1"], "pp must be a whole number >= 1", None),
    (["predict", "--tp", "x", "--conc", "1"], "'x' is not a valid integer", None),
    (["predict", "--tp", "3", "--conc", "1", *FAST], "tp=3 does not divide", None),
    (
        ["predict", "--pp", "8", "--conc", "1", "--model", "{t}/tiny/config.json"],
        "pp=8 is more stages than the model's 4 layers",
        None,
    ),
    (["predict", "--tp", "1", "--conc", "1"], "does not fit at tp=1 pp=1", None),
    (["predict", "--conc", "0", *FAST], "concurrency must be a whole number >= 1", None),
    (["predict", "--conc", "-4", *FAST], "concurrency must be a whole number >= 1", None),
    (["predict", "--conc", "1", "--model", "gpt-9"], "unknown model 'gpt-9'; known presets", None),
    (
        ["predict", "--conc", "1", "--model", "acme/Some-Model-7B"],
        "unknown model 'acme/Some-Model-7B': no preset stands for this Hugging Face id (pipesim downloads nothing)",
        None,
    ),
    (
        ["predict", "--conc", "1", *FAST, "--kv-cache-dtype", "fp4"],
        "--kv-cache-dtype 'fp4' is not known",
        None,
    ),
    (["predict", "--conc", "1", "--model", "{t}/missing/config.json"], "model config not found", None),
    (["predict", "--conc", "1", "--model", "{t}/bad.json"], "cannot read model config", None),
    (
        ["predict", "--conc", "1", "--model", "{t}/nonnum/config.json"],
        "'num_hidden_layers' = 'many' must be a whole number",
        None,
    ),
    (["predict", "--conc", "1", "--profile", "nope"], "unknown profile 'nope'; known:", None),
    (["predict", "--conc", "1", "--profile", "{t}/empty"], "unknown profile", None),
    (["predict", "--tp", "8", "--conc", "1", "--input-len", "100000000"], "the KV cache holds", None),
    (
        "predict --box h200-1x --engine vllm --model llama-3.1-70b --conc 1 --gpu-memory-utilization 0.96".split(),
        "llama-3.1-70b leaves no KV cache at tp=1 pp=1",
        None,
    ),
    (
        "predict --engine vllm --box l4-8x --model llama-3.1-8b --tp 2 --conc 1 --gpu-memory-utilization 0.99".split(),
        "vLLM would refuse to start",
        None,
    ),
    (["predict", "--conc", "1", *FAST[:2], "--input-len", "0"], "need 1 <= LO <= HI", None),
    (["predict", "--conc", "1", *FAST[:2], "--output-len", "9:3"], "need 1 <= LO <= HI", None),
    (["predict", "--conc", "1", *FAST[:2], "--input-len", "a:b"], "is not a token count", None),
    (["predict", "--rate", "0", *FAST], "arrival rate must be > 0", None),
    (["predict", "--rate", "1", "--num-requests", "0", *FAST], "number of requests must be >= 1", None),
    (["predict", "--rate", "1", "--conc", "2", *FAST], "give one of concurrency, rate or trace", None),
    (["predict", *FAST], "give a concurrency (--conc)", None),
    (["predict", "--trace", "{t}/nothere.csv", *FAST[:2]], "trace file not found", None),
    (["predict", "--trace", "{t}/trace_cols.csv", *FAST[:2]], "missing column(s) arrival_s", None),
    (["predict", "--trace", "{t}/trace_neg.csv", *FAST[:2]], "line 3, column arrival_s", None),
    (["predict", "--trace", "{t}/trace_zero.csv", *FAST[:2]], "line 2, column input_tokens", None),
    (
        ["predict", "--pp", "2", "--conc", "1", "--layers", "10,10", *FAST],
        "sums to 20, the model has 32 layers",
        None,
    ),
    (
        ["predict", "--pp", "2", "--conc", "1", "--layers", "a,b", *FAST],
        "must be comma-separated whole numbers",
        None,
    ),
    predict_case("--engine", "tensorrt", says="'tensorrt' is not one of"),
    predict_case("--max-num-seqs", "8", says="max_num_seqs is not a sglang knob"),
    predict_case("--pp-async-batch-depth", "-1", says="--pp-async-batch-depth must be a whole number >= 0"),
    predict_case("--max-running-requests", "0", says="--max-running-requests must be a whole number >= 1"),
    predict_case(
        "--mem-fraction-static", "1.2", says="--mem-fraction-static must be a number in (0, 1), got 1.2"
    ),
    predict_case(
        "--engine",
        "vllm",
        "--gpu-memory-utilization",
        "0",
        says="--gpu-memory-utilization must be a number in (0, 1), got 0.0",
    ),
    predict_case("--gpu-memory-utilization", "0.8", says="gpu_memory_utilization is not a sglang knob"),
    predict_case(
        "--engine", "vllm", "--mem-fraction-static", "0.8", says="mem_fraction_static is not a vllm knob"
    ),
    (
        ["predict", "--tp", "1", "--pp", "8", "--conc", "1", "--mem-fraction-static", "0.7"],
        "kimi-k2.6 does not fit at tp=1 pp=8: stage 7 needs 75.3 GiB of weights per GPU, but sglang may use "
        "66.9 GiB",
        None,
    ),
    predict_case("--profile", "{t}/trunc", says="collectives.csv.gz"),
    predict_case("--profile", "{t}/nocol", says="missing column(s) nbytes"),
    predict_case("--profile", "{t}/nan", says="line 2, column latency_ms"),
    predict_case("--profile", "{t}/neg", says="line 2, column latency_ms"),
    predict_case("--profile", "{t}/dup", says="line 3: sizes must not repeat"),
    predict_case("--profile", "{t}/seconds", says="not seconds"),
    predict_case("--profile", "{t}/badparam", says="cpu_iteration_ms"),
    (["profiles", "show", "nope"], "unknown profile 'nope'", None),
    (["validate", "--profile", "{t}/nopoints"], "has no measured points", None),
    (
        ["calibrate", "fit", "--profile", "{t}/nopoints", "--params", "cpu_iteration_ms"],
        "no measured points to fit",
        None,
    ),
    (
        [
            "calibrate",
            "fit",
            "--profile",
            "rtx-pro-6000-sglang-deployment",
            "--params",
            "warp_speed",
            "--out",
            "{t}/fitted",
        ],
        "cannot fit warp_speed",
        "{t}/fitted",
    ),
    (
        ["calibrate", "import", "nccl-tests", "{t}/nothere.txt", "--profile", "{t}/nopoints"],
        "nccl-tests output not found",
        None,
    ),
    (
        [
            "calibrate",
            "import",
            "nccl-tests",
            "{t}/unreadable.txt",
            "--profile",
            "{t}/nopoints",
            "--gpus",
            "8",
            "--out",
            "{t}/out1",
        ],
        "no data rows found",
        "{t}/out1",
    ),
    (
        [
            "calibrate",
            "import",
            "bench",
            "{t}/bad.json",
            "--profile",
            "{t}/nopoints",
            "--format",
            "vllm",
            "--tp",
            "8",
            "--pp",
            "1",
            "--out",
            "{t}/out2",
        ],
        "not JSON",
        "{t}/out2",
    ),
    (
        [
            "calibrate",
            "import",
            "aiconfigurator",
            "{t}/empty",
            "--box",
            "rtx-pro-6000-server-8x",
            "--out",
            "{t}/out3",
        ],
        "missing AIConfigurator table",
        "{t}/out3",
    ),
    (
        ["calibrate", "import", "aiconfigurator", "{t}/empty", "--box", "nobox", "--out", "{t}/out4"],
        "unknown box 'nobox'",
        "{t}/out4",
    ),
    (
        [
            "calibrate",
            "import",
            "aiconfigurator",
            "{t}/empty",
            "--box",
            "rtx-pro-6000-server-8x",
            "--engine-version",
            "0.5.14",
            "--out",
            "{t}/out5",
        ],
        "a flat folder's SGLang tables name no engine version",
        "{t}/out5",
    ),
    (["boxes", "show", "nobox"], "unknown box 'nobox'; known presets", None),
    (["boxes", "show", "{t}/cycle.toml"], "the links form a cycle (a -> b -> a)", None),
    (["boxes", "show", "{t}/twoparents.toml"], "gpu1 has two parents (a and b)", None),
    (["boxes", "show", "{t}/negbw.toml"], "bw_gb_s = -5 must be a finite number > 0", None),
    (["boxes", "show", "{t}/unreach.toml"], "gpu1 is not connected to gpu0", None),
    (["boxes", "show", "{t}/strcount.toml"], "gpu.count = 'two' must be a whole number >= 1", None),
    (["boxes", "show", "{t}/infbw.toml"], "gpu.mem_bw_bytes_s = inf must be a finite number > 0", None),
    (["boxes", "show", "{t}/gpu9.toml"], "link names gpu9, but gpu.count = 2", None),
    (["boxes", "show", "{t}/badnet.toml"], "network.nic_gb_s = 0 must be a finite number > 0", None),
    predict_case("--kernel-scale", "0", says="--kernel-scale must be a finite number > 0, got 0.0"),
    predict_case(
        "--cpu-iteration-ms", "-1", says="--cpu-iteration-ms must be a finite number >= 0, got -1.0"
    ),
    (["search", "--splits", "2by4"], "--splits '2by4': '2by4' is not TPxPP", None),
    (["search", "--rate", "0,1"], "--rate: 0 is not a number > 0", None),
    (["search", "--rate", "1", "--conc", "8"], "give --conc or --rate, not both", None),
    (["sweep", "--rate", "fast"], "--rate 'fast' must be comma-separated numbers > 0", None),
    (["search", "--plot", "{t}/pareto.jpg"], "figure file '{t}/pareto.jpg' must end in .png or .svg", None),
    (
        ["plot", "{t}/nothere.csv", "--out-dir", "{t}/bad.json/figures"],
        "cannot make the figure folder '{t}/bad.json/figures': '{t}/bad.json' is a file, not a folder",
        None,
    ),
    (["validate", "--corpus", "{t}/no-corpus"], "corpus folder not found: {t}/no-corpus", None),
    predict_case(
        "--plot", "{t}/t.png", says="--plot draws the sensitivity tornado: give --sensitivity with it"
    ),
    predict_case("--sensitivity", "--step", "1.5", says="sensitivity step must be between 0 and 1"),
    predict_case(
        "--ensemble",
        "--no-intervals",
        says="--ensemble estimates the intervals: drop --no-intervals or --ensemble",
    ),
    predict_case("--nodes", "0", says="--nodes must be a whole number >= 1, got 0"),
    predict_case("--nodes", "2", "--network", "carrier-pigeon", says="unknown network 'carrier-pigeon'"),
    predict_case("--nodes", "2", "--box", "h200-1x", says="box h200-1x has no [network] section"),
    predict_case(
        "--profile",
        "rtx-pro-6000-sglang-healthy",
        "--box",
        "h100-sxm-8x",
        says="profile rtx-pro-6000-sglang-healthy was measured on rtx-pro-6000-server-8x with sglang, not this run's "
        "h100-sxm-8x with sglang (GPU NVIDIA RTX PRO 6000 Blackwell Server Edition vs NVIDIA H100 80GB HBM3; "
        "box rtx-pro-6000-server-8x vs h100-sxm-8x)",
    ),
    predict_case(
        "--profile",
        "rtx-pro-6000-sglang-healthy",
        "--engine",
        "vllm",
        says="(engine sglang vs vllm); leave out --profile to use this box's own tables, or pass --allow-foreign-profile",
    ),
]


def _doc_rows() -> dict[str, str]:
    """docs/bad-input.md's table: command (DIR for the scratch folder) -> message quoted."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `(pipesim [^`]*)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(2).replace("\\|", "|")
    return rows


DOC_ROWS = _doc_rows()


def _fill(x, t):
    return x.replace("{t}", str(t)) if isinstance(x, str) else x


@pytest.mark.parametrize("args, message, leftover", CASES, ids=[" ".join(c[0][:4]) for c in CASES])
def test_bad_input(args, message, leftover, files, capsys):
    args = [_fill(a, files) for a in args]
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2, (args, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("pipesim: error: ")
    assert _fill(message, files) in lines[0], lines[0]
    # the message docs/bad-input.md quotes for this command is the one printed today
    quoted = DOC_ROWS.get("pipesim " + " ".join(str(a).replace(str(files), "DIR") for a in args))
    if quoted is not None:
        assert quoted.replace("DIR", str(files)) in lines[0], (quoted, lines[0])
    if leftover:
        path = Path(_fill(leftover, files))
        assert not path.exists()
        assert not list(path.parent.glob(f".{path.name}.*"))  # no half-written temporary either


def test_at_least_thirty_bad_inputs():
    assert len(CASES) >= 30


def test_every_case_is_documented():
    doc = DOC.read_text()
    for _, message, _ in CASES:
        message = message.replace("{t}", "DIR")
        assert re.sub(r"\s+", " ", message) in re.sub(r"\s+", " ", doc), message


def test_catalogue_without_the_extra_names_it(monkeypatch, tmp_path, capsys):
    # a box costed from AIConfigurator tables pipesim does not ship, aiconfigurator-core not installed
    from pipesim.profiles import catalogue

    monkeypatch.setattr(catalogue, "data_root", lambda: None)
    text = (DOC.parent.parent / "pipesim" / "data" / "boxes" / "h100-sxm-8x.toml").read_text()
    box = tmp_path / "a30-box.toml"
    box.write_text(text.replace('"h100_sxm"', '"a30"'))
    with pytest.raises(SystemExit) as exc:
        main(["predict", "--conc", "1", "--box", str(box), *FAST])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    message = (
        "is costed from AIConfigurator's measured a30 tables, which pipesim does not ship and are not "
        "installed: pip install 'pipesim[catalogue]'"
    )
    assert message in err
    assert message in DOC.read_text()


def test_engine_versions_pipesim_does_not_model_are_documented(capsys):
    for args in (
        ["predict", "--conc", "1", "--engine-version", "0.3.0", *FAST],
        ["predict", "--conc", "1", "--engine", "vllm", "--engine-version", "0.4.2", *FAST],
        [
            "predict",
            "--conc",
            "1",
            "--engine",
            "vllm",
            "--engine-version",
            "0.9.2",
            "--async-scheduling",
            *FAST,
        ],
        ["predict", "--conc", "1", "--engine", "vllm", "--num-scheduler-steps", "8", *FAST],
    ):
        with pytest.raises(SystemExit) as exc:
            main(args)
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and len(err.splitlines()) == 1
        assert err.split("error: ", 1)[1] in DOC.read_text()

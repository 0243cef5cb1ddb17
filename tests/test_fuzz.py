"""Fuzzing the entry points, and killing profile writes.

The fuzz draws command lines and model config / trace / profile.toml / box files and
asserts the promise of docs/bad-input.md: exit 0 or 2, one line on stderr on error,
never a traceback; every drawn run is small (few tokens, small models) and the
bounds of pipesim/checks.py keep the rest from starting. The fault tests interrupt a
profile write at every point and assert the profile is then the old or the new one,
with no temporary folder left (a SIGKILL may leave the write's own hidden folder, which
no later run removes: base/writes.py)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesim.cli import main
from pipesim.profiles.profile import _profile_dir, load_profile
from pipesim.profiles.writing import write_profile

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
NUMBER_TEXT = st.sampled_from(
    [
        "0",
        "1",
        "-1",
        "2",
        "8",
        "16",
        "1.5",
        "nan",
        "inf",
        "-inf",
        "1e300",
        "10000000000",
        "abc",
        "",
        "0x10",
        "1e3",
        "True",
        "3:1",
        "1:4",
    ]
)
JSON_VALUE = st.one_of(
    st.integers(-3, 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=4),
    st.none(),
    st.lists(st.integers(0, 4), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 4), max_size=2),
)
CONFIG_KEYS = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "text_config",
    "quantization_config",
    "architectures",
    "torch_dtype",
    "kv_lora_rank",
]
TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}
SMALL = ["--input-len", "8", "--output-len", "4"]


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    return code, err


def assert_clean(code, err, argv):
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pipesim: error: "), (argv, err)


@FUZZ
@given(
    flags=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--tp",
                    "--pp",
                    "--conc",
                    "--rate",
                    "--num-requests",
                    "--seed",
                    "--nodes",
                    "--max-running-requests",
                    "--pp-async-batch-depth",
                    "--chunked-prefill-size",
                    "--layers",
                    "--input-len",
                    "--output-len",
                ]
            ),
            NUMBER_TEXT,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_fuzz_predict_flags(flags, capsys):
    argv = ["predict", "--model", "llama-3.1-8b", "--tp", "8", *SMALL]
    for flag, value in flags:
        argv += [flag, value]
    if not any(f in ("--conc", "--rate") for f, _ in flags):
        argv += ["--conc", "1"]
    # a drawn run stays small: at most a few hundred requests of a few tokens
    assert_clean(*run_cli(argv, capsys), argv)


@FUZZ
@given(
    cmd=st.sampled_from(["sweep", "search"]),
    gpus=NUMBER_TEXT,
    conc=NUMBER_TEXT,
    workers=st.sampled_from(["0", "-1", "1", "100000", "x"]),
)
def test_fuzz_sweep_flags(cmd, gpus, conc, workers, capsys):
    argv = [cmd, "--model", "llama-3.1-8b", *SMALL, "--gpus", gpus, "--conc", conc, "--workers", workers]
    code, err = run_cli(argv, capsys)
    assert_clean(code, err, argv)


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON_VALUE, min_size=1, max_size=3))
def test_fuzz_model_config(changes, tmp_path_factory, capsys):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps({**TINY, **changes}))
    argv = ["predict", "--model", str(path), "--conc", "1", *SMALL]
    assert_clean(*run_cli(argv, capsys), argv)


@FUZZ
@given(
    rows=st.lists(st.tuples(NUMBER_TEXT, NUMBER_TEXT, NUMBER_TEXT), min_size=0, max_size=4),
    header=st.sampled_from(["arrival_s,input_tokens,output_tokens", "arrival_s,input_tokens", ""]),
)
def test_fuzz_trace(rows, header, tmp_path_factory, capsys):
    path = tmp_path_factory.mktemp("trace") / "t.csv"
    path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows))
    argv = ["predict", "--model", "llama-3.1-8b", "--trace", str(path)]
    assert_clean(*run_cli(argv, capsys), argv)


@FUZZ
@given(
    key=st.sampled_from(["name", "box", "engine", "engine_version", "params", "deployment", "sources"]),
    value=st.sampled_from(
        [
            "5",
            '"x"',
            "true",
            "nan",
            "inf",
            "[1, 2]",
            "{ a = 1 }",
            "{ max_running_requests = -1 }",
            "{ cpu_iteration_ms = inf }",
            '{ max_running_requests = "x" }',
        ]
    ),
)
def test_fuzz_profile_toml(key, value, tmp_path_factory, capsys):
    d = tmp_path_factory.mktemp("prof") / "p"
    shutil.copytree(Path(str(_profile_dir("rtx-pro-6000-sglang-healthy"))), d)
    lines = [ln for ln in (d / "profile.toml").read_text().splitlines() if not ln.startswith(f"{key} =")]
    text = "\n".join(lines).replace(f"[{key}]", f"[{key}_moved]")
    (d / "profile.toml").write_text(f"{key} = {value}\n{text}\n")
    argv = ["predict", "--profile", str(d), "--model", "llama-3.1-8b", "--conc", "1", *SMALL]
    assert_clean(*run_cli(argv, capsys), argv)


@FUZZ
@given(count=NUMBER_TEXT, bw=NUMBER_TEXT, mem=NUMBER_TEXT, parent=st.sampled_from(["a", "gpu0", "gpu1", "b"]))
def test_fuzz_box_file(count, bw, mem, parent, tmp_path_factory, capsys):
    path = tmp_path_factory.mktemp("box") / "b.toml"

    def toml(v):
        return (
            v
            if v.replace(".", "").replace("-", "").replace("e", "").isdigit() or v in ("nan", "inf", "-inf")
            else json.dumps(v)
        )

    path.write_text(
        f'[gpu]\nname = "g"\ncount = {toml(count)}\nmemory_bytes = {toml(mem)}\nmem_bw_bytes_s = 1e12\n'
        f'flops_bf16 = 1e14\n[topology]\nlinks = [{{ child = "gpu0", parent = "a", bw_gb_s = {toml(bw)}, '
        f'latency_us = 1 }}, {{ child = "gpu1", parent = "{parent}", bw_gb_s = 1, latency_us = 1 }}]\n'
    )
    argv = ["boxes", "show", str(path)]
    assert_clean(*run_cli(argv, capsys), argv)


# ---- killing profile writes -----------------------------------------------------------


def _versions(tmp_path):
    """An old profile at tmp/p and the meta of a new one (a different description)."""
    src = load_profile("rtx-pro-6000-sglang-healthy")
    out = tmp_path / "p"
    write_profile(out, {**src.meta, "description": "old"}, dict(src.tables))
    return out, {**src.meta, "description": "new"}, dict(src.tables)


def _state(out: Path, leftovers: tuple[str, ...] = ()) -> str:
    """The profile's description after a load (which puts back a profile a kill left
    aside), the hidden names left beside it being only of the `leftovers` patterns."""
    prof = load_profile(out)
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    assert all(any(fnmatch.fnmatch(n, pat) for pat in leftovers) for n in left), left
    return prof.meta["description"]


@pytest.mark.parametrize("k", range(4))
def test_write_killed_at_each_rename_leaves_old_or_new(k, tmp_path, monkeypatch):
    out, meta, tables = _versions(tmp_path)
    real, calls = os.rename, []

    def rename(a, b):
        calls.append(1)
        if len(calls) == k + 1:
            raise KeyboardInterrupt  # stands for a kill: nothing after this point runs
        return real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    try:
        write_profile(out, meta, tables)
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(os, "rename", real)
    assert _state(out) in ("old", "new")


@pytest.mark.parametrize("aside", [".p.old", ".p.old-x1y2"])
def test_write_killed_between_the_renames_is_recovered_on_load(aside, tmp_path):
    out, _, _ = _versions(tmp_path)
    os.rename(out, out.with_name(aside))  # the state a kill there leaves (before 0.2: .p.old)
    (tmp_path / ".p.new-x").mkdir()
    (tmp_path / ".p.new-x" / "mine.txt").write_text("keep me")
    assert _state(out, (".p.new-x",)) == "old"
    assert (tmp_path / ".p.new-x" / "mine.txt").read_text() == "keep me"  # not this run's: untouched


def test_write_killed_by_sigkill_at_random_points(tmp_path):
    """A real kill: a child process writes the new profile and is SIGKILLed after a
    delay that sweeps the write; after each the profile is the old or the new one."""
    out, _, _ = _versions(tmp_path)
    code = (
        "import sys; from pipesim.profiles.profile import load_profile\n"
        "from pipesim.profiles.writing import write_profile\n"
        "src = load_profile('rtx-pro-6000-sglang-healthy')\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
        f"write_profile({str(out)!r}, {{**src.meta, 'description': 'new'}}, dict(src.tables))\n"
    )
    seen = set()
    for delay_s in (0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3):
        child = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout.readline().strip() == "ready"
        child.stdin.write("go\n")
        child.stdin.flush()
        try:
            child.wait(timeout=delay_s)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            child.wait()
        seen.add(_state(out, (".p.new-*", ".p.old-*")))
        assert seen <= {"old", "new"}


def test_out_that_is_a_file_is_refused_and_kept(tmp_path):
    from pipesim.base.errors import UserError

    f = tmp_path / "mine.txt"
    f.write_text("keep me")
    src = load_profile("rtx-pro-6000-sglang-healthy")
    with pytest.raises(UserError, match="is a file, not a profile folder"):
        write_profile(f, src.meta, dict(src.tables))
    assert f.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_plot_writes_all_figures_or_none(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    from test_plot import table

    from pipesim.explore import plot

    real, calls = Figure.savefig, []

    def savefig(self, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(self, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", savefig)
    with pytest.raises(RuntimeError):
        plot.save_all(table(), tmp_path)
    assert list(tmp_path.iterdir()) == []


# ---- fields of user files read through checks.Fields: a UserError, never another error --------

QUANT_KEYS = {
    "fp8": ["weight_block_size", "modules_to_not_convert", "ignored_layers", "activation_scheme"],
    "awq": ["bits", "w_bit", "group_size", "q_group_size", "zero_point", "modules_to_not_convert"],
    "gptq": ["bits", "group_size", "sym", "desc_act", "modules_to_not_convert"],
    "modelopt": ["quant_algo", "quantization", "exclude_modules", "ignore", "group_size"],
    "mxfp4": ["modules_to_not_convert"],
    "compressed-tensors": ["config_groups", "ignore", "format"],
}
GROUP = st.fixed_dictionaries(
    {},
    optional={
        "targets": JSON_VALUE,
        "weights": st.one_of(
            JSON_VALUE,
            st.dictionaries(
                st.sampled_from(
                    ["num_bits", "type", "strategy", "group_size", "symmetric", "block_structure"]
                ),
                st.one_of(
                    JSON_VALUE, st.sampled_from(["int", "float", "group", "block", "channel", 4, 8, 128])
                ),
                max_size=6,
            ),
        ),
        "input_activations": st.one_of(
            JSON_VALUE, st.dictionaries(st.just("num_bits"), JSON_VALUE, max_size=1)
        ),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    method=st.sampled_from(sorted(QUANT_KEYS)),
    data=st.data(),
)
def test_fuzz_quantization_config(method, data):
    """Any quantization_config of a modelled method, its fields of any JSON type: a weight
    format with positive bytes per weight, or one UserError (never a TypeError, ValueError
    or AttributeError from inside)."""
    from pipesim.base.errors import UserError
    from pipesim.inputs.quantization import weight_formats

    keys = QUANT_KEYS[method]
    fields = data.draw(
        st.dictionaries(
            st.sampled_from(keys),
            st.one_of(JSON_VALUE, st.dictionaries(st.text(max_size=3), GROUP, max_size=2), GROUP),
            max_size=4,
        )
    )
    try:
        formats = weight_formats({"quant_method": method, **fields}, "fuzz")
    except UserError:
        return
    assert all(f.bytes_per_param > 0 and f.group >= 0 for f in formats), formats


MEASURED_CELL = st.sampled_from(["8", "1", "0", "-1", "inf", "nan", "1e12", "2.5", "x", "", "1e308", "64"])


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    cells=st.fixed_dictionaries(
        {c: MEASURED_CELL for c in ("tp", "pp", "conc", "tok_s")},
        optional={c: MEASURED_CELL for c in ("input_len", "output_len", "pp_async_batch_depth", "tok_s_hi")},
    )
)
def test_fuzz_measured_points(cells):
    """Any measured.csv row: points whose every number is finite and in range, or one
    UserError naming the line and column."""
    import io

    from pipesim.base.errors import UserError
    from pipesim.profiles.measured import read_points

    text = ",".join(cells) + "\n" + ",".join(cells.values()) + "\n"
    try:
        points = read_points(io.StringIO(text), "measured.csv")
    except UserError as exc:
        assert "measured.csv" in str(exc)
        return
    for p in points:
        assert 1 <= p.tp <= 65536 and 1 <= p.pp <= 65536 and 1 <= p.conc <= 65536
        assert 0 < p.lo <= p.hi < float("inf")


# ---- a sweep table with figures not defined (one-token outputs) through every reader ----

_UNDEFINED_COLS = ("per_request_tok_s", "tpot_ms_p50", "tpot_ms_p99")


def _sweep_table():
    """A real sweep (two splits of 2 GPUs, C=1,2, 4-token outputs), made once."""
    global _TABLE
    if "_TABLE" not in globals():
        from pipesim.explore.sweep import sweep

        _TABLE = sweep(2, [1, 2], model="llama-3.1-8b", input_len=16, output_len=4)
    return _TABLE.copy()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    undefined=st.lists(st.booleans(), min_size=4, max_size=4),
    suffix=st.sampled_from([".csv", ".parquet"]),
    objective=st.sampled_from(
        ["throughput", "throughput-per-gpu", "max-load", "per-request", "ttft", "fewest-gpus"]
    ),
    constraints=st.dictionaries(
        st.sampled_from(
            [
                "min_per_request_tok_s",
                "max_ttft_p50_ms",
                "max_ttft_p99_ms",
                "max_tpot_p50_ms",
                "max_tpot_p99_ms",
            ]
        ),
        st.sampled_from([0.0, 1.0, 50.0, 1e4]),
        max_size=2,
    ),
)
def test_fuzz_undefined_figures_read_back(undefined, suffix, objective, constraints, tmp_path_factory):
    """A sweep table whose rows drawn at random have no per-request speed or TPOT (as a
    run of one-token outputs writes them: docs/search.md §5), written as CSV or Parquet:
    read back with the same cells; search by any objective and bounds gives a result or
    one UserError (never another error), and a point without a figure never wins by it or
    meets a bound on it; the trade-off figures draw."""
    import numpy as np

    from pipesim.base.errors import UserError
    from pipesim.base.files import read_table, write_table
    from pipesim.explore import plot
    from pipesim.explore.objectives import CONSTRAINTS
    from pipesim.explore.search import search

    df = _sweep_table()
    gone = np.array(undefined)
    for col in _UNDEFINED_COLS:
        for c in (col, f"{col}_lo", f"{col}_hi"):
            if c in df.columns:
                df.loc[gone, c] = np.nan
    out = tmp_path_factory.mktemp("undef") / f"t{suffix}"
    write_table(df, out)
    back = read_table(out)
    assert back.per_request_tok_s.isna().tolist() == undefined
    try:
        result = search(table=back, objective=objective, **constraints)
    except UserError as exc:
        assert str(exc).strip() and "\n" not in str(exc)
        result = None
    if result is not None:
        w = result.winner
        assert objective != "per-request" or w.per_request_tok_s == w.per_request_tok_s
        for k in constraints:
            col = CONSTRAINTS[k][0]
            assert w[col] == w[col], (k, w[col])  # an undefined figure meets no bound
        plot.pareto(result)
    else:  # refused: only where the objective or a bound names a figure no row has, or none meets them
        assert constraints or (objective == "per-request" and all(undefined))
    plot.tradeoff(back)

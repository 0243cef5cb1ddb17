"""Silent wrong answers from valid-looking input (issue #27, class 2): every measured
table against physics (profiles/bounds.py), parameters and enumerated values against
what they may be, a routing distribution between measured ones read between them, and
a prefill chunk never priced above the same tokens prefilled whole."""

from __future__ import annotations

import glob
import io
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesim.base.errors import UserError
from pipesim.inputs.box import load_box
from pipesim.profiles import derived
from pipesim.profiles.bounds import Datasheet, check_bounds
from pipesim.profiles.profile import Params, load_profile
from pipesim.profiles.tables import TABLE_COLUMNS, read_columns

ROOT = Path(__file__).resolve().parents[1]
PROPS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
# the catalogue's GPUs with a box preset (their datasheets)
BOXES = {
    "a100_sxm": "a100-sxm-8x",
    "b200_sxm": "b200-8x",
    "h100_sxm": "h100-sxm-8x",
    "h200_sxm": "h200-sxm-8x",
    "l40s": "l40s-8x",
    "rtx_pro_6000_server": "rtx-pro-6000-server-8x",
}


def measured_tables():
    """(name, table, columns, datasheet) of every table pipesim ships: the shipped
    profiles' and the catalogue's of every GPU with a box preset, each engine's newest."""
    out = []
    for system, box in BOXES.items():
        sheet = Datasheet.of(load_box(box))
        for engine in ("sglang", "vllm"):
            found = derived.load_tables(system, engine, None)
            for table, cols in (found[0] if found else {}).items():
                out.append((f"{system} {engine}", table, cols, sheet))
    sheet = Datasheet.of(load_box("rtx-pro-6000-server-8x"))
    for f in sorted(glob.glob(str(ROOT / "calibration/profiles/rtx-pro-6000-*/*.csv.gz"))):
        table = Path(f).name.split(".")[0]
        out.append((Path(f).parent.name, table, read_columns(f, table, f), sheet))
    return out


TABLES = measured_tables()
IDS = [f"{n} {t}" for n, t, _, _ in TABLES]


@pytest.mark.parametrize("name, table, cols, sheet", TABLES, ids=IDS)
def test_every_measured_table_is_within_the_bounds(name, table, cols, sheet):
    check_bounds(cols, table, name, TABLE_COLUMNS[table], sheet)


@pytest.mark.parametrize("name, table, cols, sheet", TABLES, ids=IDS)
def test_the_same_table_in_the_wrong_unit_is_refused(name, table, cols, sheet):
    """Every table the package ships, written in microseconds or in seconds instead of
    milliseconds, is refused, naming the likely unit."""
    for factor, unit in ((1e3, "microseconds"), (1e-3, "seconds")):
        with pytest.raises(UserError, match=unit):
            check_bounds(
                {**cols, "latency_ms": cols["latency_ms"] * factor}, table, name, TABLE_COLUMNS[table], sheet
            )


@PROPS
@given(pick=st.integers(0, len(TABLES) - 1), row=st.floats(0, 1))
def test_one_row_in_microseconds_among_milliseconds_is_refused(pick, row):
    """A row a thousand times too slow is refused (unless it is the largest size of its
    shape: then no larger row shows the jump, and its own slowness stays under the
    per-table bound; test_the_same_table... covers the whole table)."""
    name, table, cols, sheet = TABLES[pick]
    lat = np.array(cols["latency_ms"], dtype=float)
    i = min(int(row * len(lat)), len(lat) - 1)
    axis = {"gemm": "m", "moe": "tokens", "moe_ep": "tokens", "collectives": "nbytes"}.get(table)
    keys = [k for k in TABLE_COLUMNS[table] if k not in (axis, "context", "isl")]
    same = np.all([np.asarray(cols[k]) == np.asarray(cols[k])[i] for k in keys], axis=0)
    size = np.asarray(cols[axis or ("context" if "decode" in table else "isl")], dtype=float)
    if not (same & (size > size[i])).any():
        return  # the largest size of its shape
    lat[i] *= 1e3
    with pytest.raises(UserError, match="faster than a smaller|microseconds"):
        check_bounds({**cols, "latency_ms": lat}, table, name, TABLE_COLUMNS[table], sheet)


def test_a_profile_written_in_microseconds_is_refused_where_it_loads(tmp_path):
    import shutil

    src = ROOT / "calibration/profiles/rtx-pro-6000-sglang-healthy"
    shutil.copytree(src, tmp_path / "p")
    cols = read_columns(src / "gemm.csv.gz", "gemm", str(src / "gemm.csv.gz"))
    import pandas as pd

    df = pd.DataFrame(cols).assign(latency_ms=lambda d: d.latency_ms * 1e3)
    df.to_csv(tmp_path / "p" / "gemm.csv.gz", index=False)
    with pytest.raises(UserError, match=r"gemm.csv.gz: even its fastest row, line \d+ .*microseconds"):
        load_profile(tmp_path / "p")


# ---- imports: refused before anything is written -----------------------------------------


def test_an_nccl_tests_file_in_seconds_is_refused_and_nothing_written(tmp_path):
    from pipesim.profiles.importers.nccl_tests import import_file

    text = (ROOT / "tests/data/all_reduce_perf_8gpu.txt").read_text()
    lines = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit() and len(parts) in (12, 13):
            parts[-8] = f"{float(parts[-8]) * 1e-6:.3g}"  # the time column in seconds
            line = "  ".join(parts)
        lines.append(line)
    (tmp_path / "all_reduce_perf.txt").write_text("\n".join(lines))
    with pytest.raises(UserError, match="seconds"):
        import_file(tmp_path / "all_reduce_perf.txt", "rtx-pro-6000-sglang-healthy", tmp_path / "out", gpus=8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all_reduce_perf.txt"]


def test_negative_latencies_are_never_written(tmp_path):
    import pandas as pd

    from pipesim.profiles.writing import write_profile

    src = load_profile("rtx-pro-6000-sglang-healthy")
    bad = src.tables["collectives"].assign(latency_ms=lambda d: -d.latency_ms)
    with pytest.raises(UserError, match="column latency_ms: value '-"):
        write_profile(tmp_path / "p", src.meta, {"collectives": bad})
    nan = pd.DataFrame(
        {**{c: [1] for c in TABLE_COLUMNS["gemm"]}, "dtype": ["bf16"], "latency_ms": [math.nan]}
    )
    with pytest.raises(UserError, match="column latency_ms"):
        write_profile(tmp_path / "p", src.meta, {"gemm": nan})
    assert list(tmp_path.iterdir()) == []


def test_an_aiconfigurator_system_in_microseconds_is_refused(tmp_path):
    from test_importers import _parquet

    from pipesim.profiles.importers.aiconfigurator import import_profile

    pytest.importorskip("pyarrow")
    root = tmp_path / "h100_sxm"
    _parquet(
        root / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet",
        {
            "kernel_source": ["vllm_default"] * 2,
            "gemm_dtype": ["bfloat16"] * 2,
            "m": [1, 8],
            "n": [4096, 4096],
            "k": [4096, 4096],
            "latency": [15.0, 16.0],  # microseconds, where AIConfigurator stores milliseconds
        },
        "0.24.0",
    )
    with pytest.raises(UserError, match="microseconds"):
        import_profile(root, tmp_path / "out", kernel_set="vllm", box="h100-sxm-8x")
    assert not (tmp_path / "out").exists()


# ---- parameters and enumerated values ------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("kernel_scale", 0, "kernel_scale = 0 must be a finite number > 0"),
        ("allreduce_scale", 0.0, "allreduce_scale = 0.0 must be a finite number > 0"),
        ("custom_allreduce_max_gpus", 2.5, "custom_allreduce_max_gpus must be a whole number"),
        ("moe_distribution", "banana", "moe_distribution 'banana' is not known"),
        ("moe_distribution", "power_law_0", "moe_distribution 'power_law_0' is not known"),
        ("moe_distribution", "power_law_nan", "is not known"),
    ],
)
def test_a_parameter_outside_its_range_is_refused(key, value, says):
    with pytest.raises(UserError, match=says):
        Params.from_dict({key: value}, "profile.toml")


@pytest.mark.parametrize(
    "column, cell, says",
    [
        ("distribution", "banana", "column distribution: routing distribution 'banana' is not known"),
        ("dtype", "bf61", "column dtype: value 'bf61' is not allowed"),
    ],
)
def test_an_enumerated_table_cell_outside_its_values_is_refused(column, cell, says):
    f = ROOT / "calibration/profiles/rtx-pro-6000-sglang-healthy/moe.csv.gz"
    cols = read_columns(f, "moe", str(f))
    import pandas as pd

    df = pd.DataFrame(cols)
    df.loc[3, column] = cell
    with pytest.raises(UserError, match=f"line 5, {says}"):
        read_columns(io.StringIO(df.to_csv(index=False)), "moe", "moe")


# ---- routing distributions: read as numbers, between measured ones interpolated -------------


def _routed(distribution: str, tokens: int = 64):
    from pipesim.costs.stage import CostModel
    from pipesim.scenario.build import build_scenario

    sc = build_scenario(concurrency=1, tp=8, moe_distribution=distribution)
    return CostModel(sc.box, sc.model, sc.plan, sc.profile).moe(tokens, 8)


def test_a_distribution_is_read_as_its_number():
    assert _routed("power_law_1.20") == _routed("power_law_1.2")
    assert _routed("power_law_1.2") != _routed("balanced")


@PROPS
@given(s=st.floats(1.01, 1.2, exclude_min=True, exclude_max=True), tokens=st.sampled_from([1, 16, 256, 4096]))
def test_a_distribution_between_measured_ones_is_interpolated(s, tokens):
    lo, _ = _routed("power_law_1.01", tokens)
    hi, _ = _routed("power_law_1.2", tokens)
    mid, tag = _routed(f"power_law_{s!r}", tokens)
    assert min(lo, hi) <= mid <= max(lo, hi) and tag in ("interpolated", "extrapolated")


def test_a_distribution_beyond_the_measured_ones_is_scaled_from_the_nearest():
    t15, tag = _routed("power_law_1.5", 256)
    t12, _ = _routed("power_law_1.2", 256)
    assert tag == "scaled" and t15 != t12 and t15 != _routed("balanced", 256)[0]


# ---- a prefill chunk against the same tokens prefilled whole --------------------------------


def _cost_model(**kw):
    from pipesim.costs.stage import CostModel
    from pipesim.scenario.build import build_scenario

    sc = build_scenario(concurrency=1, **kw)
    return sc, CostModel(sc.box, sc.model, sc.plan, sc.profile)


MODELS = [
    dict(tp=8),  # Kimi K2.6, MLA prefill table
    dict(tp=8, model="llama-3.1-8b"),  # GQA prefill table
    dict(tp=4, pp=2, model="llama-3.1-70b", engine="vllm", profile="rtx-pro-6000-vllm"),
    dict(tp=4, model="qwen3-30b-a3b", box="l4-8x"),  # no table: the roofline
]


@PROPS
@given(which=st.integers(0, len(MODELS) - 1), chunk=st.integers(1, 16384), prefix=st.integers(0, 65536))
def test_a_chunk_is_never_priced_above_the_same_tokens_prefilled_whole(which, chunk, prefix):
    sc, cm = _cost_model(**MODELS[which])
    part, _ = cm.attention_prefill(chunk, prefix, sc.plan.tp)
    whole, _ = cm.attention_prefill(prefix + chunk, 0, sc.plan.tp)
    assert part <= whole


@pytest.mark.parametrize("which", range(len(MODELS)))
def test_a_one_token_chunk_costs_about_a_decode_step(which):
    """One query token against `prefix` cached ones is a decode step's attention: read at
    the whole-prompt length of equal work, within 2x (was 10x and more: the chunk's own
    kernel time multiplied by 1 + 2 prefix)."""
    sc, cm = _cost_model(**MODELS[which])
    for prefix in (50, 499, 4000, 30000):
        chunk, _ = cm.attention_prefill(1, prefix, sc.plan.tp)
        decode, _ = cm.attention_decode(1, prefix + 1, sc.plan.tp)
        assert chunk <= 2.0 * decode, (prefix, chunk, decode)


@PROPS
@given(chunk=st.integers(1, 16384), prefix=st.integers(0, 65536))
def test_on_the_roofline_a_chunks_whole_stage_is_never_above_the_whole_prefill(chunk, prefix):
    """Where every operation is priced by the roofline (monotone in its size), the whole
    stage holds the invariant too; measured GEMM tables carry their measured noise (a
    GEMM of 16 rows up to 3% slower than of 17 in one vLLM table)."""
    from pipesim.costs.primitives import Shape

    sc, cm = _cost_model(**MODELS[-1])
    part = sum(cm.stage_time(0, Shape(prefill=((chunk, prefix),), graphed=False)))
    whole = sum(cm.stage_time(0, Shape(prefill=((prefix + chunk, 0),), graphed=False)))
    assert part <= whole * (1 + 1e-12)

"""The catalogue of boxes' costs: pipesim's shipped derived AIConfigurator tables price a
box on a plain install; they equal the raw measured tables; `boxes show` names the
source each box's costs come from; a sweep over several boxes never loses a box's rows."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from pipesim.cli import main
from pipesim.profiles import catalogue, derived
from pipesim.scenario.build import build_scenario

RAW_H200 = REPO.parent / "shared" / "reference-data" / "aiconfigurator" / "h200_sxm"
FAST = ["--model", "llama-3.1-8b", "--output-len", "8", "--input-len", "16"]


@pytest.fixture
def plain_install(monkeypatch):
    """aiconfigurator-core absent, as after `pip install pipesim`: its module is not found
    and it has no installed metadata."""
    find_spec, version = importlib.util.find_spec, importlib.metadata.version

    def no_spec(name, *args, **kwargs):
        return None if name.split(".")[0] == "aiconfigurator_core" else find_spec(name, *args, **kwargs)

    def no_version(name):
        if name == "aiconfigurator-core":
            raise importlib.metadata.PackageNotFoundError(name)
        return version(name)

    monkeypatch.setattr(importlib.util, "find_spec", no_spec)
    monkeypatch.setattr(importlib.metadata, "version", no_version)
    assert catalogue.data_root() is None and catalogue.installed_version() is None


def test_plain_install_prices_h100_from_the_shipped_tables(plain_install):
    sc = build_scenario(box="h100-sxm-8x", model="llama-3.1-70b", tp=4, concurrency=32)
    prof = sc.profile
    assert prof.name == "aiconfigurator-h100_sxm-sglang" and prof.box == "h100-sxm-8x"
    assert "shipped" in prof.meta["built_by"] and "aiconfigurator_core" not in sys.modules
    # SGLang 0.5.14 kernels and NCCL 2.29.2, as the reference data's README and the H100 folder say
    assert prof.engine_version == "0.5.14"
    assert prof.meta["table_sources"]["gemm"] == "AIConfigurator h100_sxm sglang 0.5.14 gemm_perf"
    assert "nccl 2.29.2" in prof.meta["table_sources"]["collectives"]
    # the shipped tables cost the run: kernels and the TP4 all-reduce read from them
    gemm, tp_ar = prof.tables.columns("gemm"), prof.collectives[("all_reduce", "custom", 4)]
    assert len(gemm["m"]) > 10_000 and tp_ar(8192 * 2 * 32) > 0
    result = __import__("pipesim").predict(box="h100-sxm-8x", tp=2, conc=2, **_fast(), intervals=False)
    shares = result.provenance_shares
    assert shares["measured"] + shares["interpolated"] > 0.5 and shares["roofline (fitted)"] == 0


def _fast():
    return dict(model="llama-3.1-8b", input_len=16, output_len=8)


@pytest.mark.parametrize("system,engine", [("h100_sxm", "sglang"), ("l40s", "vllm")])
def test_shipped_tables_are_what_the_installed_extra_builds(system, engine):
    """Rebuilt from aiconfigurator-core at run time, the same profile: every table, every
    column, the kernel floor and the custom all-reduce's reach (skipped without the extra
    or with another release of it than the one shipped)."""
    root = catalogue.data_root()
    if root is None or catalogue.installed_version() != derived.index(system)["aiconfigurator_core"]:
        pytest.skip("needs the aiconfigurator-core release the shipped tables were derived from")
    shipped = catalogue._shipped_profile(system, engine, None)
    built = catalogue._catalogue_profile(str(root / system), engine, None)
    assert shipped.params == built.params and shipped.meta["table_sources"] == built.meta["table_sources"]
    assert list(shipped.tables) == list(built.tables)
    for table in shipped.tables:
        a, b = shipped.tables.columns(table), built.tables.columns(table)
        assert list(a) == list(b)
        for col in a:
            assert np.array_equal(a[col], b[col]), (table, col)


def _raw(name):
    if not RAW_H200.is_dir():
        pytest.skip(f"raw reference tables not present at {RAW_H200}")
    return pd.read_csv(RAW_H200 / f"{name}.csv.gz")


def _expect(raw, keys, n=40, seed=7):
    """n sampled keys of `raw` and their latency: the mean of the rows measured at that
    key, to 6 significant digits (the importer's contract)."""
    means = raw.groupby(keys, as_index=False)["latency"].mean()
    return means.iloc[np.random.default_rng(seed).choice(len(means), min(n, len(means)), replace=False)]


def _derived(table, key_values):
    """The shipped H200 SGLang table's latency at each key (a dict per sampled row)."""
    cols = derived.load_tables("h200_sxm", "sglang", None)[0][table]()  # each table read when first used
    out = []
    for want in key_values:
        hit = np.ones(len(cols["latency_ms"]), dtype=bool)
        for c, v in want.items():
            hit &= cols[c] == v
        assert hit.sum() == 1, (table, want)
        out.append(float(cols["latency_ms"][hit][0]))
    return np.array(out)


def _check(table, sample, mapping, fixed):
    keys = [{**fixed, **{new: row[old] for old, new in mapping.items()}} for _, row in sample.iterrows()]
    want = np.array([float(f"{x:.6g}") for x in sample["latency"]])
    np.testing.assert_array_equal(_derived(table, keys), want)


def test_derived_tables_equal_the_raw_ones_at_sampled_points():
    gemm = _raw("gemm_perf")
    bf16 = gemm[(gemm.kernel_source == "sglang_torch_linear") & (gemm.gemm_dtype == "bfloat16")]
    _check("gemm", _expect(bf16, ["m", "n", "k"]), {"m": "m", "n": "n", "k": "k"}, {"dtype": "bf16"})
    fp8 = gemm[(gemm.kernel_source == "sglang_sgl_kernel_fp8_scaled_mm") & (gemm.gemm_dtype == "fp8")]
    _check("gemm", _expect(fp8, ["m", "n", "k"]), {"m": "m", "n": "n", "k": "k"}, {"dtype": "fp8"})

    moe = _raw("moe_perf")
    int4 = moe[
        (moe.kernel_source == "sglang_marlin_moe") & (moe.moe_dtype == "int4_wo") & (moe.moe_ep_size == 1)
    ]
    cols = ["hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "distribution", "num_tokens"]
    names = ["hidden", "inter", "topk", "experts", "moe_tp", "distribution", "tokens"]
    _check("moe", _expect(int4, cols), dict(zip(cols, names)), {"dtype": "int4"})

    # H200 has no FlashInfer rows: SGLang's Hopper default FA3 is the one read
    att = _raw("generation_attention_perf")
    fa3 = att[
        (att.kernel_source == "fa3")
        & (att.kv_cache_dtype == "bfloat16")
        & (att.beam_width == 1)
        & (att.window_size == 0)
    ]
    cols = ["num_heads", "num_key_value_heads", "head_dim", "batch_size", "step"]
    names = ["heads_per_gpu", "kv_heads_per_gpu", "head_dim", "batch", "context"]
    _check("gqa_decode", _expect(fa3, cols), dict(zip(cols, names)), {})

    mla = _raw("generation_mla_perf")
    mla = mla[(mla.mla_dtype == "bfloat16") & (mla.kv_cache_dtype == "bfloat16")]
    _check(
        "mla_decode",
        _expect(mla, ["num_heads", "batch_size", "step"]),
        {"num_heads": "heads_per_gpu", "batch_size": "batch", "step": "context"},
        {},
    )

    # message_size counts 2-byte elements: nbytes = 2 x message_size
    nccl = _raw("nccl_perf")
    nccl = nccl[nccl.nccl_dtype == "half"].assign(nbytes=lambda d: 2 * d.message_size)
    _check(
        "collectives",
        _expect(nccl, ["op_name", "num_gpus", "nbytes"]),
        {"op_name": "op", "num_gpus": "gpus", "nbytes": "nbytes"},
        {"impl": "nccl"},
    )
    custom = _raw("custom_allreduce_perf")
    custom = custom[custom.backend == "sglang_graph"].assign(nbytes=lambda d: 2 * d.message_size)
    _check(
        "collectives",
        _expect(custom, ["num_gpus", "nbytes"]),
        {"num_gpus": "gpus", "nbytes": "nbytes"},
        {"impl": "custom", "op": "all_reduce"},
    )


def test_boxes_show_names_where_each_box_is_costed_from(capsys):
    version = derived.index("h100_sxm")["aiconfigurator_core"]
    main(["boxes", "show", "h100-sxm-8x"])
    out = capsys.readouterr().out
    assert (
        f"sglang  AIConfigurator's measured h100_sxm tables, derived and shipped with pipesim "
        f"(aiconfigurator-core {version}, Apache-2.0): sglang 0.5.14" in out
    )
    assert "vllm    AIConfigurator's measured h100_sxm tables" in out and ": vllm 0.24.0" in out
    main(["boxes", "show", "rtx-pro-6000-server-8x"])
    out = capsys.readouterr().out
    assert (
        "sglang  shipped profile rtx-pro-6000-sglang-deployment, measured on this box (sglang 0.5.14)" in out
    )
    assert "vllm    shipped profile rtx-pro-6000-vllm, measured on this box (vllm 0.19.0)" in out
    main(["boxes", "show", "l4-8x"])
    out = capsys.readouterr().out
    assert out.count("first principles: the roofline on the box's datasheet rates") == 2


def test_a_newer_installed_release_is_read_instead(monkeypatch, capsys):
    if catalogue.data_root() is None:
        pytest.skip("aiconfigurator-core (pipesim[catalogue]) not installed")
    monkeypatch.setattr(catalogue, "installed_version", lambda: "99.0.0")
    main(["boxes", "show", "a100-sxm-8x"])
    assert "from the installed aiconfigurator-core 99.0.0 (newer than pipesim's shipped tables)" in (
        capsys.readouterr().out
    )
    prof = build_scenario(box="a100-sxm-8x", model="llama-3.1-8b", concurrency=1).profile
    assert prof.meta["built_by"] == "pipesim catalogue (built from the installed aiconfigurator-core 99.0.0)"


def test_an_engine_version_the_tables_lack_reads_the_newest_and_says_so(capsys):
    """The version picks the host loop's rules (profiles/hostloop.py); a version whose
    kernels AIConfigurator did not measure reads the newest tables, each line saying so."""
    main(
        [
            "predict",
            "--conc",
            "1",
            "--box",
            "h100-sxm-8x",
            "--engine-version",
            "0.5.10",
            "--no-intervals",
            *FAST,
        ]
    )
    out = capsys.readouterr().out
    assert "sglang 0.5.10" in out
    assert "(AIConfigurator did not measure sglang 0.5.10, the version asked: the newest tables)" in out


def test_a_multi_box_sweep_keeps_every_box_or_says_why(plain_install, capsys):
    df = __import__("pipesim").sweep(
        2,
        [2],
        splits=[(2, 1)],
        box=["rtx-pro-6000-server-8x", "h100-sxm-8x"],
        workers=1,
        progress=False,
        **_fast(),
    )
    assert sorted(df["box"]) == ["h100-sxm-8x", "rtx-pro-6000-server-8x"] and not df.attrs["skipped"]
    # a version pipesim does not model stops the sweep before it runs, in one line
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "sweep",
                "--gpus",
                "2",
                "--conc",
                "2",
                "--box",
                "h100-sxm-8x,rtx-pro-6000-server-8x",
                "--engine-version",
                "0.2.0",
                *FAST,
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    assert "--engine-version '0.2.0': pipesim models sglang 0.3.4 to 0.5.x" in err

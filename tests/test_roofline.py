"""The fitted roofline: its formula, the shipped coefficients, where costs.py uses them,
and the leave-one-GPU-out validation computed from real measured tables."""

from __future__ import annotations

import importlib.util
import json
import sys
from functools import lru_cache
from importlib import resources

import numpy as np
import pytest
from conftest import REPO

from pipesim.costs.roofline import FIT_FILE, PROVENANCE_FITTED, Curve, shipped_fit
from pipesim.costs.stage import CostModel
from pipesim.inputs.box import load_box
from pipesim.inputs.model import load_model
from pipesim.inputs.plan import make_plan
from pipesim.profiles.catalogue import data_root, first_principles_profile

CLASSES = ("memory", "gemm_bf16", "gemm_fp8", "attention_decode", "attention_prefill", "moe_bf16", "moe_int4")


@lru_cache(maxsize=1)
def _script():
    spec = importlib.util.spec_from_file_location("fit_roofline", REPO / "calibration" / "fit_roofline.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _shipped() -> dict:
    return json.loads((resources.files("pipesim.data") / FIT_FILE).read_text())


def test_memory_only_kernel_is_latency_plus_bytes_over_the_achieved_bandwidth():
    c = Curve(latency_s=4e-6, mem_eff=0.8, math_eff=0.5, sharpness=2.0)
    assert c.seconds(1e9, 0.0, 1e12, 1e15) == pytest.approx(4e-6 + 1e9 / 0.8e12, rel=1e-12)


def test_soft_maximum_lies_between_the_max_and_the_sum_and_tends_to_the_max():
    bw, rate, nbytes, flops = 1e12, 1e14, 1e8, 1e10  # 1e-4 s of memory, 1e-4 s / 0.5 of math
    t_mem, t_math = nbytes / bw, flops / (0.5 * rate)
    t = Curve(0.0, 1.0, 0.5, 2.0).seconds(nbytes, flops, bw, rate)
    assert t == pytest.approx((t_mem**2 + t_math**2) ** 0.5)
    assert max(t_mem, t_math) < t < t_mem + t_math
    assert Curve(0.0, 1.0, 0.5, 500.0).seconds(nbytes, flops, bw, rate) == pytest.approx(
        max(t_mem, t_math), rel=1e-2
    )


def test_shipped_coefficients_are_physical_and_carry_their_validation():
    doc, fit = _shipped(), shipped_fit()
    assert "aiconfigurator-core" in doc["source"]
    for op in CLASSES:
        c = fit.curve(op)
        assert 0.0 < c.mem_eff <= 1.0 and 0.0 < c.math_eff <= 1.0 and c.sharpness >= 1.0
        assert 1e-6 < c.latency_s < 1e-4  # a kernel launch and tail: microseconds, not ms
        assert doc["residuals"][op]  # in-sample residuals listed per GPU
    # every fitted GPU was held out once, with errors per class
    assert set(doc["leave_one_out"]) == set(doc["boxes"]) and len(doc["boxes"]) >= 4


def test_docs_roofline_md_is_generated_from_the_shipped_fit():
    assert _script().render(_shipped()) == (REPO / "docs" / "roofline.md").read_text()


def test_a_gpu_without_tables_uses_the_fitted_curves():
    box, llama = load_box("l4-8x"), load_model("llama-3.1-70b")
    cm = CostModel(
        box, llama, make_plan(8, 1, llama.num_layers, 8, "vllm"), first_principles_profile(box, "vllm")
    )
    fit = shipped_fit()
    m, n, k = 32, 1280, 8192
    t, source = cm.gemm(m, n, k, "bf16")
    nbytes = n * k * 2 + 2 * (m * k + m * n)  # bf16 weights, activations in and out
    assert source == PROVENANCE_FITTED
    assert t == pytest.approx(fit.curve("gemm_bf16").seconds(nbytes, 2 * m * n * k, 300e9, 121e12), rel=1e-12)
    t, source = cm.elementwise(32, 8192)
    assert source == PROVENANCE_FITTED
    assert t == pytest.approx(
        fit.curve("memory").latency_s + 2 * 32 * 8192 * 2 / (fit.curve("memory").mem_eff * 300e9)
    )
    # slower than the plain roofline at the datasheet rates: no kernel reaches them
    assert t > 2 * 32 * 8192 * 2 / 300e9


def test_a_profile_with_measured_kernels_keeps_its_own_floor(profile):
    box, kimi = load_box("rtx-pro-6000-server-8x"), load_model("kimi-k2.6")
    cm = CostModel(box, kimi, make_plan(8, 1, kimi.num_layers, 8, "sglang"), profile)
    t, source = cm.elementwise(64, 7168)
    assert source == "roofline"
    floor = profile.params.kernel_floor_us * 1e-6
    assert t == pytest.approx(2 * 64 * 7168 * 2 / box.gpu.mem_bw_bytes_s + floor, rel=1e-12)


def test_leave_one_gpu_out_from_real_measured_tables():
    if data_root() is None:
        pytest.skip("aiconfigurator-core (pipesim[catalogue]) not installed")
    fr = _script()
    rows, read = fr.load_rows(["a100_sxm", "h100_sxm", "h200_sxm"], cap=120)
    if len({r.system for r in rows}) < 2:
        pytest.skip("fewer than two measured GPUs found")
    held = fr.leave_one_out(rows, "h100_sxm")
    gemm = next(r for r in rows if r.system == "h100_sxm" and r.op == "gemm_bf16")
    # the held-out rows are the H100's measured GEMM latencies, read from its table
    from pipesim.profiles.importers.aiconfigurator import build_tables

    table = build_tables(data_root() / "h100_sxm", kernel_set="vllm")["gemm"]
    measured = set(np.round(table[table.dtype == "bf16"].latency_ms.to_numpy() * 1e-3, 12))
    assert set(np.round(gemm.measured_s[: len(gemm.measured_s) // 2], 12)) <= measured
    # its error: the curve fitted without the H100, by hand
    curve = fr.fit_class([r for r in rows if r.op == "gemm_bf16" and r.system != "h100_sxm"])
    err = np.abs(fr.predict(curve, gemm) / gemm.measured_s - 1) * 100
    assert held["gemm_bf16"]["fitted"]["rows"] == len(gemm.measured_s)
    assert held["gemm_bf16"]["fitted"]["median_abs_pct"] == pytest.approx(np.median(err), abs=0.05)
    # the calibrated curve predicts an unseen GPU better than the datasheet roofline
    for op in ("gemm_bf16", "attention_decode"):
        assert held[op]["fitted"]["median_abs_pct"] < held[op]["plain"]["median_abs_pct"]


def test_a_gpu_of_a_measured_die_takes_that_dies_own_curves():
    """An A100 40 GB (same_die_as a100_sxm) goes through the curves fitted on the A100 80 GB's
    tables alone, at its own 1,555 GB/s and 312 TFLOPS; a GPU of no measured die through
    the curves of every measured GPU."""
    doc, box, llama = _shipped(), load_box("a100-sxm-40gb-8x"), load_model("llama-3.1-70b")
    assert box.same_die_as == "a100_sxm" and "a100_sxm" in doc["per_gpu"]
    c = Curve.from_dict(doc["per_gpu"]["a100_sxm"]["gemm_bf16"])
    cm = CostModel(
        box, llama, make_plan(8, 1, llama.num_layers, 8, "sglang"), first_principles_profile(box, "sglang")
    )
    m, n, k = 8, 8192, 8192
    t, source = cm.gemm(m, n, k, "bf16")
    nbytes = n * k * 2 + 2 * (m * k + m * n)
    assert source == PROVENANCE_FITTED
    assert t == pytest.approx(c.seconds(nbytes, 2 * m * n * k, 1555e9, 312e12), rel=1e-12)
    assert t != pytest.approx(shipped_fit().curve("gemm_bf16").seconds(nbytes, 2 * m * n * k, 1555e9, 312e12))


def test_a_die_the_roofline_was_not_fitted_on_is_one_line(tmp_path, capsys):
    from pipesim.cli import main

    text = (REPO / "pipesim" / "data" / "boxes" / "a100-sxm-40gb-8x.toml").read_text()
    (tmp_path / "b.toml").write_text(text.replace('same_die_as = "a100_sxm"', 'same_die_as = "a30"'))
    with pytest.raises(SystemExit) as exc:
        main(["predict", "--box", str(tmp_path / "b.toml"), "--model", "llama-3.1-8b", "--conc", "1"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    assert "same_die_as = 'a30' is not a GPU the roofline was fitted on" in err

"""Prediction intervals: the band formula, the calibration part by regime, the
ensemble's members, and the quadrature rule (docs/uncertainty.md)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import SHORT_LLAMA as FAST
from conftest import SHORT_LLAMA_ARGS

import pipesim
from pipesim.calibrate.fit import FitResult
from pipesim.cli import main
from pipesim.inputs.box import load_box
from pipesim.profiles.measured import Point
from pipesim.profiles.profile import load_profile
from pipesim.report import uncertainty as U
from pipesim.report.table import table
from pipesim.scenario.build import build_scenario


def _point(tp, pp, conc, name):
    return Point(
        name, "kimi-k2.6", "sglang", tp, pp, conc, 256, 300, "output_tok_s", 100.0, 100.0, (), "test"
    )


def _profile_with(points, loo):
    prof = load_profile("rtx-pro-6000-sglang-deployment")
    meta = {
        **prof.meta,
        "fit": {"loo_error_pct": {p.name: e for p, e in zip(points, loo)}, "loo_mape_pct": 1.0},
    }
    return replace(prof, meta=meta, measured=tuple(points))


def test_band_is_multiplicative_and_positive():
    assert U.band(100.0, 0.25) == pytest.approx((80.0, 125.0))
    lo, hi = U.band(100.0, 3.0)  # a huge relative error stays positive
    assert lo == pytest.approx(25.0) and hi == pytest.approx(400.0)


def test_too_few_points_use_their_largest_error_never_a_smaller_default():
    prof = load_profile("rtx-pro-6000-sglang-deployment")  # three measured points, LOO 282%, 0%, 0%
    stored = prof.meta["fit"]["loo_error_pct"]
    cal = U.calibration_spread(prof, 2, 4, 64)
    assert cal.rel == pytest.approx(max(abs(v) for v in stored.values()) / 100)
    assert cal.rel > U.DEFAULT_CALIBRATION_REL and cal.points == 3 and cal.regime == "largest"
    assert "fewer than 5" in cal.basis and "282%" in cal.basis
    # errors all smaller than the default: the default, and the basis says it was raised
    pts = [_point(8, 1, 32, "a"), _point(8, 1, 1, "b")]
    small = U.calibration_spread(_profile_with(pts, [5, -10]), 8, 1, 32)
    assert small.rel == U.DEFAULT_CALIBRATION_REL and "raised to the default" in small.basis
    # no leave-one-out error at all: the stated default
    bare = replace(prof, meta={k: v for k, v in prof.meta.items() if k != "fit"})
    none = U.calibration_spread(bare, 2, 4, 64)
    assert none.rel == U.DEFAULT_CALIBRATION_REL and none.points == 0 and "stated default" in none.basis


def test_features_no_measurement_checked_widen_the_band_by_the_stated_rule():
    from pipesim.report.unchecked import unchecked

    plain = build_scenario(tp=8, concurrency=8, **FAST)
    assert unchecked(plain) == ()
    dp_ep = build_scenario(
        model="qwen3-30b-a3b",
        tp=8,
        dp=2,
        dp_attention=True,
        ep=8,
        concurrency=8,
        input_len="32",
        output_len="8",
    )
    assert [u.feature.split(" (")[0] for u in unchecked(dp_ep)] == ["data parallel", "expert parallel"]
    l4 = build_scenario(
        box="l4-8x", model="llama-3.1-8b", tp=2, concurrency=8, input_len="32", output_len="8"
    )
    assert [u.feature for u in unchecked(l4)] == ["a GPU without tables (NVIDIA L4)"]
    # a GPU with tables somewhere (AIConfigurator's H100), priced by the roofline alone: the
    # corpus residuals were measured on it
    from pipesim.calibrate.corpus_scenario import profile_for

    h100 = build_scenario(
        box="h100-sxm-8x",
        model="llama-3.1-8b",
        profile=profile_for("h100-sxm-8x", "sglang", "llama-3.1-8b", "roofline"),
        tp=2,
        concurrency=8,
        input_len="32",
        output_len="8",
    )
    assert not h100.profile.tables and unchecked(h100) == ()
    from pipesim.sim.runner import run

    r = run(dp_ep)
    iv, basis = U.intervals(r, dp_ep, workload="none")
    assert [u["feature"] for u in basis["unchecked"]] == [u.feature for u in unchecked(dp_ep)]
    for m in U.HEADLINE:
        p = basis["parts"][m]
        assert p["unchecked"] == pytest.approx(math.sqrt(2) * U.DEFAULT_CALIBRATION_REL)
        # two unchecked features: two more parts of the default size, in quadrature
        c, below, above = U.band_log(
            m,
            p["calibration"],
            basis["unmeasured_share"],
            (0.0, p["simulation"], *(U.DEFAULT_CALIBRATION_REL,) * 2),
        )
        assert (p["below_log"], p["above_log"]) == pytest.approx((below, above))
    narrower, _ = U.intervals(r, replace(dp_ep, plan=replace(dp_ep.plan, dp=1, ep=1)), workload="none")
    lo, hi = iv["output_throughput_tok_s"]
    nlo, nhi = narrower["output_throughput_tok_s"]
    assert lo < nlo and hi > nhi
    assert "unchecked: data parallel (DP2), expert parallel (EP8)" in table(U.attach(r, dp_ep, "none"))


def test_regime_quantile_from_leave_one_out_errors():
    pts = [_point(8, 1, 32 + i, f"b{i}") for i in range(6)] + [_point(8, 1, 1, "single")]
    prof = _profile_with(pts, [10, -20, 30, -40, 50, -60, 500])
    cal = U.calibration_spread(prof, 8, 1, 64)
    # the six batched TP points only; the C=1 point's 500% is another regime
    assert cal.points == 6 and cal.regime == "batched, TP"
    assert cal.rel == pytest.approx(float(np.quantile([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 0.8)))


def test_regime_falls_back_to_the_load_class_then_all():
    pts = [
        _point(8, 1, 32, "a"),
        _point(8, 1, 64, "b"),
        _point(8, 1, 16, "c"),
        _point(2, 4, 64, "d"),
        _point(1, 8, 8, "e"),
    ]
    prof = _profile_with(pts, [10, 10, 10, 20, 20])
    cal = U.calibration_spread(prof, 2, 4, 64)  # 2 PP points: too few; 5 batched: enough
    assert cal.regime == "batched" and cal.points == 5


def test_fit_result_stores_leave_one_out_by_label():
    pts = (_point(8, 1, 1, "x"), _point(8, 1, 32, "y"))
    r = FitResult({}, pts, (1.0, 2.0), (0.0, 0.0), (0.5, None), 0)
    assert r.loo_error_pct() == {"x": 50.0}


def test_ensemble_widens_fixed_lengths_keeping_the_mean_and_varies_the_seed():
    sc = build_scenario(tp=1, pp=1, concurrency=4, **{**FAST, "input_len": "100", "output_len": "40:60"})
    members = U.ensemble_scenarios(sc, 4)
    assert sorted(m.workload.seed for m in members) == [1, 2, 3, 4]
    for m in members:
        assert (m.workload.input_len.lo, m.workload.input_len.hi) == (50, 150)  # same mean 100
        assert (m.workload.output_len.lo, m.workload.output_len.hi) == (40, 60)  # given as a range: kept


def test_frontend_cost_is_spread_when_the_profile_has_one():
    sc = build_scenario(tp=1, pp=1, concurrency=4, **FAST)
    sc = replace(sc, profile=sc.profile.with_params(frontend_ms=2.0))
    assert sorted({m.profile.params.frontend_ms for m in U.ensemble_scenarios(sc, 4)}) == [1.0, 3.0]


def test_parts_combine_in_quadrature_and_the_band_holds_the_value():
    from pipesim.sim.runner import run

    sc = build_scenario(tp=1, pp=1, concurrency=4, **FAST)
    raw = run(sc)
    r = U.attach(raw, sc, workload="ensemble", runs=3)
    share = r.interval_basis["unmeasured_share"]
    assert 0 <= share < 0.2  # the reference box's tables price nearly all of it
    for m in U.HEADLINE:
        p = r.interval_basis["parts"][m]
        # the parts in quadrature (test_band_log_... checks the blend by hand)
        c, below, above = U.band_log(m, p["calibration"], share, (p["workload"], p["simulation"]))
        assert (p["centre_log"], p["below_log"], p["above_log"]) == pytest.approx((c, below, above))
        lo, hi = r.intervals[m]
        v = getattr(r, m)
        assert v == pytest.approx(getattr(raw, m) * math.exp(c))  # the headline, corrected by the centre
        assert (lo, hi) == pytest.approx((v * math.exp(-below), v * math.exp(above)))
        assert lo < v < hi
    cheap = U.attach(run(sc), sc, workload="none")
    assert all(cheap.interval_basis["parts"][m]["workload"] == 0 for m in U.HEADLINE)


@pytest.mark.parametrize("box", ["l4-8x", "h100-pcie-8x", "rtx-4090-8x", "a100-sxm-8x"])
def test_a_roofline_headline_is_corrected_and_inside_its_band(box):
    """On boxes priced by the roofline (no tables, or a first-principles profile) the
    headline is the simulated figure x e^(u x the residuals' median) (read from the shipped
    residuals.json here, not from the code), and every headline lies inside its band."""
    from importlib import resources

    from pipesim.profiles.catalogue import first_principles_profile
    from pipesim.sim.runner import run

    groups = json.loads((resources.files("pipesim.data") / "residuals.json").read_text())["groups"]
    b = load_box(box)
    sc = build_scenario(
        box=b, profile=first_principles_profile(b, "sglang"), model="llama-3.1-8b", tp=2, concurrency=8
    )
    raw = run(sc, warmup_requests=8, measure_requests=16, ci_target=None)
    r = U.attach(raw, sc)
    u = r.interval_basis["unmeasured_share"]
    assert u == pytest.approx(1.0)
    f = {g: math.exp(u * v["q_mid"]) for g, v in groups.items()}
    assert r.output_throughput_tok_s == pytest.approx(raw.output_throughput_tok_s * f["throughput"])
    assert r.request_throughput_req_s == pytest.approx(raw.request_throughput_req_s * f["throughput"])
    assert r.ttft_ms_p50 == pytest.approx(raw.ttft_ms_p50 * f["ttft"])
    assert r.tpot_ms_p99 == pytest.approx(raw.tpot_ms_p99 * f["tpot"])
    assert r.per_request_tok_s == pytest.approx(raw.per_request_tok_s / f["tpot"])
    assert r.interval_basis["uncorrected"]["ttft_ms_p50"] == raw.ttft_ms_p50
    for m in U.HEADLINE:
        lo, hi = r.intervals[m]
        assert lo <= getattr(r, m) <= hi, m
    text = table(r)
    assert f"corrected: throughput x{f['throughput']:.3g}" in text
    assert f"simulated {raw.output_throughput_tok_s:,.1f} tok/s" in text


def test_cli_prints_and_serialises_intervals(capsys):
    args = ["predict", "--conc", "4", *SHORT_LLAMA_ARGS]
    main(args)
    assert "(likely " in capsys.readouterr().out
    main(args + ["--json"])
    d = json.loads(capsys.readouterr().out)
    lo, hi = d["intervals"]["output_throughput_tok_s"]
    assert lo < d["output_throughput_tok_s"] < hi
    main(args + ["--json", "--no-intervals"])
    assert "intervals" not in json.loads(capsys.readouterr().out)


# ---- part (b) from the run itself ---------------------------------------------------


def _closed_result(sc, throughputs, per_stretch):
    """A Result whose measured requests form consecutive stretches of `per_stretch`
    requests, stretch i at closed-loop throughput throughputs[i]: every request has 100
    output tokens and latency C x 100 / throughputs[i] (renewal-reward: C x output /
    latency is the stretch's throughput)."""
    from pipesim.measure.metrics import Result

    c = sc.workload.concurrency
    out, e2e, finish = [], [], []
    t = 0.0
    for tput in throughputs:
        for _ in range(per_stretch):
            out.append(100)
            e2e.append(c * 100 / tput * 1e3)
            t += 1.0
            finish.append(t)
    n = len(out)
    cols = {
        "output_len": np.array(out),
        "e2e_ms": np.array(e2e),
        "finish_s": np.array(finish),
        "ttft_ms": np.full(n, 50.0),
        "tpot_ms": np.full(n, 20.0),
        "decode_tok_s": np.full(n, 50.0),
    }
    fields = {f: 1.0 for f in Result.__dataclass_fields__ if f not in ("request_columns", "stage_columns")}
    fields.update(scenario={}, window_s=(0.0, t), request_columns=cols, stage_columns={}, period_requests=0)
    return Result(**fields)


def test_run_spread_is_the_spread_of_member_sized_stretches():
    # C = 4: a member measures max(2 x 4, 16) = 16 requests; 64 requests are 4 stretches
    # of one member each, at 100, 100, 120, 80 tok/s: std (ddof 1) = sqrt(800 / 3)
    sc = build_scenario(tp=1, pp=1, concurrency=4, **FAST)
    assert U.member_requests(sc) == 16
    r = _closed_result(sc, [100, 100, 120, 80], 16)
    spread = U.run_spread(r, sc)
    assert spread["output_throughput_tok_s"] == pytest.approx(U.Z_LIKELY * math.sqrt(800 / 3) / 100)
    assert spread["ttft_ms_p50"] == 0 and spread["tpot_ms_p99"] == 0  # equal in every stretch


def test_run_spread_scales_short_stretches_to_a_member():
    # 32 requests, fewer than 4 members: 4 stretches of 8, each half a member, so a
    # member's spread is the stretches' x sqrt(8 / 16)
    sc = build_scenario(tp=1, pp=1, concurrency=4, **FAST)
    r = _closed_result(sc, [100, 100, 120, 80], 8)
    spread = U.run_spread(r, sc)["output_throughput_tok_s"]
    assert spread == pytest.approx(U.Z_LIKELY * math.sqrt(800 / 3) / 100 * math.sqrt(0.5))


def test_default_intervals_run_no_extra_simulation_for_a_closed_loop(monkeypatch):
    import pipesim

    def boom(*a, **k):
        raise AssertionError("the ensemble ran")

    monkeypatch.setattr(U, "ensemble_spread", boom)
    r = pipesim.predict(1, 1, 4, intervals=True, **FAST)
    assert r.interval_basis["workload_method"] == "run"
    assert all(lo <= getattr(r, m) <= hi for m, (lo, hi) in r.intervals.items())


def test_open_loops_run_no_extra_simulation_by_default(monkeypatch):
    """An open loop's workload part comes from its own stretches (measure/stretches.py);
    the ensemble runs only when asked for."""
    calls = []
    monkeypatch.setattr(
        U, "ensemble_spread", lambda sc, runs: calls.append(runs) or dict.fromkeys(U.HEADLINE, 0.0)
    )
    from pipesim.sim.runner import run

    sc = build_scenario(tp=1, pp=1, rate_rps=5.0, num_requests=40, **FAST)
    r = U.attach(run(sc), sc)
    assert calls == [] and r.interval_basis["workload_method"] == "run"
    parts = r.interval_basis["parts"]
    assert parts["ttft_ms_p50"]["workload"] > 0
    assert all(lo <= getattr(r, m) <= hi for m, (lo, hi) in r.intervals.items())
    U.attach(run(sc), sc, workload="ensemble")
    assert calls == [U.ENSEMBLE_RUNS]


def test_cli_ensemble_flag(capsys):
    args = [
        "predict",
        "--conc",
        "4",
        *SHORT_LLAMA_ARGS,
        "--json",
    ]
    main(args + ["--ensemble"])
    assert json.loads(capsys.readouterr().out)["interval_basis"]["workload_method"] == "ensemble"
    main(args)
    assert json.loads(capsys.readouterr().out)["interval_basis"]["workload_method"] == "run"


def test_band_log_blends_the_profile_and_the_corpus_residuals_by_the_unmeasured_share():
    res = {
        "throughput": U.Residuals(math.log(0.2), math.log(0.8), 50, math.log(0.5)),
        "tpot": U.Residuals(-0.1, 0.9, 50, 0.2),
    }
    # nothing unmeasured: the symmetric band of the profile, other parts in quadrature
    c, below, above = U.band_log("output_throughput_tok_s", 0.25, 0.0, (0.1, 0.05), res)
    assert c == 0 and below == above
    assert math.expm1(below) == pytest.approx(math.sqrt(0.25**2 + 0.1**2 + 0.05**2))
    # all unmeasured: the headline at the residuals' median (0.5x), the band where they
    # fell, 0.2x-0.8x of the simulated figure
    c, below, above = U.band_log("output_throughput_tok_s", 0.25, 1.0, (), res)
    assert math.exp(c) == pytest.approx(0.5)
    assert (math.exp(c - below), math.exp(c + above)) == pytest.approx((0.2, 0.8))
    # half and half: the centre and both widths move halfway
    c, below, above = U.band_log("output_throughput_tok_s", 0.25, 0.5, (), res)
    assert c == pytest.approx(0.5 * math.log(0.5))
    assert below == pytest.approx(0.5 * math.log1p(0.25) + 0.5 * math.log(0.5 / 0.2))
    assert above == pytest.approx(0.5 * math.log1p(0.25) + 0.5 * math.log(0.8 / 0.5))
    # per-request tok/s is 1 / TPOT: the TPOT residuals mirrored
    c, below, above = U.band_log("per_request_tok_s", 0.25, 1.0, (), res)
    assert (c, c - below, c + above) == pytest.approx((-0.2, -0.9, 0.1))
    # a group the fit does not have: the profile's band alone
    assert U.band_log("ttft_ms_p50", 0.25, 1.0, (), res) == (
        0.0,
        pytest.approx(math.log1p(0.25)),
        pytest.approx(math.log1p(0.25)),
    )
    # a file without a median: the middle of the quantiles
    assert U.Residuals(-1.0, 0.5, 10).mid == pytest.approx(-0.25)


def test_band_log_gives_a_profile_without_points_the_corpus_error_of_measured_tables():
    """A catalogue profile (tables, no measured point of its own) carries on its measured
    share the corpus residuals of such predictions, centred and blended as the roofline's."""
    roof = {"throughput": U.Residuals(math.log(0.2), math.log(0.8), 50, math.log(0.5))}
    tables = {"throughput": U.Residuals(math.log(0.5), math.log(1.5), 50, math.log(0.8))}
    c, below, above = U.band_log("output_throughput_tok_s", 0.25, 0.0, (), roof, tables)
    assert math.exp(c) == pytest.approx(0.8)
    assert (math.exp(c - below), math.exp(c + above)) == pytest.approx((0.5, 1.5))
    c, below, above = U.band_log("output_throughput_tok_s", 0.25, 0.5, (), roof, tables)
    assert c == pytest.approx(0.5 * math.log(0.8) + 0.5 * math.log(0.5))
    assert below == pytest.approx(0.5 * math.log(0.8 / 0.5) + 0.5 * math.log(0.5 / 0.2))
    # the correction of the headline is the band's centre, group by group
    f = U.correction(0.5, roof, tables)
    assert f["throughput"] == pytest.approx(math.exp(c)) and f["ttft"] == 1.0
    # without tables: the profile's symmetric part, as before
    assert U.band_log("output_throughput_tok_s", 0.25, 0.0, (), roof, {})[0] == 0.0


def test_a_catalogue_profile_s_band_is_the_corpus_s_and_a_measured_one_keeps_its_own():
    if not U.table_residuals():
        pytest.skip("no table residuals fitted")
    r = pipesim.predict(conc=4, box="h100-sxm-8x", engine="vllm", intervals=True, **FAST)
    assert r.interval_basis["table_band"] and r.interval_basis["calibration_regime"] == "corpus tables"
    c = r.interval_basis["parts"]["output_throughput_tok_s"]["centre_log"]
    raw = r.interval_basis["uncorrected"]["output_throughput_tok_s"]
    assert r.output_throughput_tok_s == pytest.approx(raw * math.exp(c))
    r = pipesim.predict(conc=4, intervals=True, **FAST)  # the reference profile: 3 points
    assert not r.interval_basis["table_band"]


def test_residual_fit_weights_each_run_once_per_group():
    import pandas as pd

    from pipesim.calibrate import residuals as R

    # run a: three throughput numbers with one error (measured = predicted / 2);
    # runs b..e: one each at measured = 1x, 2x, 4x, 8x of the prediction
    rows = pd.DataFrame(
        [
            {
                "row_id": f"a{i}",
                "run_id": "a",
                "family": "output_throughput_tok_s",
                "predicted": 2.0,
                "measured": 1.0,
            }
            for i in range(3)
        ]
        + [
            {"row_id": k, "run_id": k, "family": "output_throughput_tok_s", "predicted": 1.0, "measured": m}
            for k, m in zip("bcde", (1.0, 2.0, 4.0, 8.0))
        ]
    ).assign(unmeasured_share=1.0, source_id="s")
    r = R.residual_rows(rows)
    assert r.weight.sum() == pytest.approx(5.0)  # five runs, each once
    x, w = r.log_residual.to_numpy(), r.weight.to_numpy()
    assert R.weighted_quantile(x, w, 0.5) == pytest.approx(math.log(2.0))  # the middle of five runs
    assert R.publisher("gpustack-perflab-qwen3-32b-h100") == "gpustack-perflab"


def test_the_unmeasured_provenances_are_costs_own():
    from pipesim.costs.provenance import PROVENANCE

    # every provenance but the measured tables' (costs.TABLE_PROVENANCE) and a measured
    # collective with its bandwidth part on this box's links ("scaled": its latency is
    # measured, collectives.py) carries the corpus band
    assert set(U.UNMEASURED) <= set(PROVENANCE) and "measured" not in U.UNMEASURED
    assert set(PROVENANCE) - set(U.UNMEASURED) == {"measured", "interpolated", "extrapolated", "scaled"}

"""Fitting: a parameter planted in a simulated measurement is recovered."""

from __future__ import annotations

import pytest

from pipesim.profiles.measured import Point
from pipesim.profiles.profile import load_profile

# ---- fitting ----------------------------------------------------------------------


def test_fit_recovers_a_planted_parameter():
    """Measure with a known CPU cost per iteration, then fit it back from zero."""
    from pipesim.calibrate.fit import fit, predict_point

    prof = load_profile("rtx-pro-6000-sglang-healthy").with_params(
        cpu_iteration_ms=0.0, eager_launch_us_per_layer=0.0
    )
    planted = prof.with_params(cpu_iteration_ms=4.0)
    points = []
    for conc in (1, 4):
        p = Point(f"C={conc}", "llama-3.1-8b", "sglang", 1, 1, conc, 64, 24, "output_tok_s", 1, 1, (), "")
        v = predict_point(planted, p)
        points.append(
            Point(p.name, p.model, p.engine, 1, 1, conc, 64, 24, "output_tok_s", v, v, (), "planted")
        )
    r = fit(prof, ["cpu_iteration_ms"], points)
    assert r.params["cpu_iteration_ms"] == pytest.approx(4.0, rel=0.02)
    assert r.mape < 1.0 and all(e is not None and abs(e) < 0.02 for e in r.loo_errors)

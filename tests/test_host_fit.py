"""The host loop's fit to the corpus (pipesim.calibrate.host_fit): knobs per engine, the
loss by hand, the search on a response planted by hand, leave one publisher out."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pipesim.calibrate import host_fit as H


def test_a_knob_is_every_engine_s_or_one_engine_s():
    theta = {"kernel_scale": 2.0, "vllm:frontend_ms": 1.0, "sglang:frontend_ms": 0.5}
    assert H.values_for(theta, "vllm") == {"kernel_scale": 2.0, "frontend_ms": 1.0}
    assert H.values_for(theta, "sglang") == {"kernel_scale": 2.0, "frontend_ms": 0.5}
    assert H.knob_name("vllm:frontend_ms") == ("vllm", "frontend_ms")
    # candidates stay inside the knob's physical bounds and never repeat the value
    lo, hi = H.KNOBS["kernel_scale"][1:]
    assert H.candidates("kernel_scale", hi, (0.5, 2.0)) == [hi / 2]
    assert H.candidates("kernel_scale", lo, (0.5, 2.0)) == [lo * 2]


def _rows(run: str, source: str, ratio_tput: float, ratio_tpot: float) -> list[dict]:
    """Compared rows of one run: two throughput numbers and one TPOT, measured = ratio x
    predicted (per-request tok/s is 1 / TPOT: its ratio inverted)."""
    return [
        dict(
            run_id=run, source_id=source, family="output_throughput_tok_s", measured=ratio_tput, predicted=1.0
        ),
        dict(
            run_id=run, source_id=source, family="output_throughput_tok_s", measured=ratio_tput, predicted=1.0
        ),
        dict(run_id=run, source_id=source, family="tpot_ms_p50", measured=ratio_tpot, predicted=1.0),
    ]


def test_the_loss_weighs_a_run_once_per_group():
    df = pd.DataFrame(_rows("a", "s", 0.5, 2.0) + _rows("b", "s", 1.0, 1.0))
    r = H.residuals(df)
    assert len(r) == 4  # (run, group) pairs
    assert H.loss(df) == pytest.approx((2 * math.log(2)) / 4)


class Planted(H.Evaluator):
    """An evaluator whose 'simulation' is a formula: throughput = 1 / kernel_scale, so a
    run measured at 1/k is fitted by kernel_scale = k; publishers differ in k."""

    def __init__(self, k_by_source: dict):
        self.k = k_by_source
        self.cache = {}
        self.on_batch = None
        self.jobs = 1
        self.parts = {f"{s}-r{i}": None for s in k_by_source for i in range(3)}
        self.engine = dict.fromkeys(self.parts, "vllm")
        self.source = {rid: rid.rsplit("-r", 1)[0] for rid in self.parts}

    def rows(self, thetas, runs):
        out = []
        for theta in thetas:
            ks = H.values_for(theta, "vllm").get("kernel_scale", 1.0)
            rows = []
            for rid in runs:
                src = rid.rsplit("-r", 1)[0]
                rows.append(
                    dict(
                        run_id=rid,
                        source_id=src,
                        family="output_throughput_tok_s",
                        measured=1 / self.k[src],
                        predicted=1 / ks,
                    )
                )
            out.append(pd.DataFrame(rows))
        return out

    def expressed(self):
        return sorted(self.parts)


def test_the_search_finds_a_planted_factor_and_a_fold_sees_only_the_others():
    ev = Planted({"gpustack-perflab-a": 2.0, "gpustack-perflab-b": 2.0, "other": 1.0})
    f = H.fit(ev, {"kernel_scale": 1.0}, ev.expressed())
    assert f.start_loss > f.loss and f.theta["kernel_scale"] == pytest.approx(2.0, rel=0.2)
    whole, folds = H.lopo(ev, {"kernel_scale": 1.0})
    by = {fold.held_out: fold for fold in folds}
    assert set(by) == {"gpustack-perflab", "other"}  # GPUStack's pages: one publisher
    # held out, GPUStack is predicted with the other publisher's factor (1.0): no better
    assert by["gpustack-perflab"].fit.theta["kernel_scale"] == pytest.approx(1.0, rel=0.2)
    assert H.loss(by["gpustack-perflab"].after) == pytest.approx(
        H.loss(by["gpustack-perflab"].before), abs=0.15
    )
    assert by["other"].fit.theta["kernel_scale"] == pytest.approx(2.0, rel=0.2)


def test_the_grid_search_keeps_the_least_loss_and_folds_search_the_same_grid():
    ev = Planted({"gpustack-perflab-a": 2.0, "gpustack-perflab-b": 2.0, "other": 1.0})
    grid = {"kernel_scale": [1.0, 0.5, 2.0, 4.0]}
    f = H.grid_fit(ev, grid, ev.expressed())
    assert f.theta == {"kernel_scale": 2.0} and f.evaluations == 4
    # the start is the grid's first value: 1.0, where GPUStack's 6 of 9 runs are 2x off
    assert f.start_loss == pytest.approx(6 / 9 * math.log(2))
    whole, folds = H.lopo(ev, grid, search=H.grid_fit)
    by = {fold.held_out: fold for fold in folds}
    assert by["gpustack-perflab"].fit.theta == {"kernel_scale": 1.0}
    assert by["other"].fit.theta == {"kernel_scale": 2.0}
    with pytest.raises(ValueError, match="outside its bounds"):
        H.grid_fit(ev, {"kernel_scale": [1.0, 100.0]}, ev.expressed())

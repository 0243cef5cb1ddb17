"""A two-stage search (explore/screen.py, two_stage.py): the plans it prices are the
scenarios a sweep would build, a running cap re-resolved as the engine resolves it,
its selection keeps what its bands cannot rule out, and on a grid small enough to
simulate whole it names the same winner as simulating everything."""

from __future__ import annotations

import math

import pandas as pd
import pytest

import pipesim
from pipesim.explore.screen import PlanSpace, _with_cap, bands, screen, select
from pipesim.scenario.steady_model import estimate

SHORT = dict(input_len="32", output_len="16")


@pytest.mark.parametrize(
    "engine,given",
    [
        ("sglang", {}),  # the deployment's per-slot cap is derived from the cap again
        ("sglang", {"pp_max_micro_batch_size": 4}),  # unless the user gave it
        ("vllm", {}),
    ],
)
def test_a_running_cap_resolves_as_the_engine_resolves_it(engine, given):
    profile = None if engine == "sglang" else "rtx-pro-6000-vllm"
    base = pipesim.build_scenario(tp=2, pp=4, concurrency=1, engine=engine, profile=profile, **given)
    knob = type(base.engine).running_cap_knob
    for cap in (16, 96):
        built = pipesim.build_scenario(
            tp=2, pp=4, concurrency=1, engine=engine, profile=profile, **given, **{knob: cap}
        )
        assert _with_cap(base, cap) == built.settings


def test_the_screen_prices_every_plan_as_its_scenario(profile):
    space = PlanSpace(
        gpus=(8,),
        loads=(2, 8),
        open_loop=False,
        splits=((8, 1), (2, 4)),
        running_caps=(16, 64),
        chunks=(512, 2048),
    )
    kw = dict(profile=profile, model="llama-3.1-70b", **SHORT)
    df, skipped = screen(space, kw, workers=1)
    assert not skipped and len(df) == space.size == 2 * 2 * 2 * 2
    row = df[(df.tp == 2) & (df.conc == 8) & (df.cap_given == 16) & (df.chunk_given == 512)].iloc[0]
    sc = pipesim.build_scenario(
        tp=2, pp=4, concurrency=8, max_running_requests=16, chunked_prefill_size=512, **kw
    )
    est = estimate(sc)
    assert row.model_output_throughput_tok_s == pytest.approx(est.output_throughput_tok_s, rel=1e-12)
    assert row.model_ttft_ms == pytest.approx(est.ttft_ms, rel=1e-12)
    assert row.split == "TP2 x PP4 [cap 16, chunk 512]" and row.running_cap == 16 and row.chunk == 512


def _plans(rows):
    """(split, tok/s point, lo, hi, ttft lo, ttft hi) -> a screen table."""
    out = []
    for split, tok, lo, hi, tlo, thi in rows:
        out.append(
            dict(
                split=split,
                gpus=8,
                conc=8,
                rate_rps=0.0,
                domain="in" if tok == tok else "outside",
                note="",
                model_output_throughput_tok_s=tok,
                model_output_throughput_tok_s_lo=lo,
                model_output_throughput_tok_s_hi=hi,
                model_per_request_tok_s=10.0,
                model_per_request_tok_s_lo=10.0,
                model_per_request_tok_s_hi=10.0,
                model_ttft_ms=(tlo + thi) / 2,
                model_ttft_ms_lo=tlo,
                model_ttft_ms_hi=thi,
                model_tpot_ms=50.0,
                model_tpot_ms_lo=50.0,
                model_tpot_ms_hi=50.0,
            )
        )
    return pd.DataFrame(out)


NO_ERROR = {"output_throughput_tok_s": 0.0, "ttft_ms": 0.0, "tpot_ms": 0.0}


def test_selection_keeps_what_the_bands_cannot_rule_out(monkeypatch):
    monkeypatch.setattr("pipesim.explore.screen.model_error", lambda: NO_ERROR)
    df = _plans(
        [
            ("A", 100.0, 90.0, 110.0, 100, 100),  # the best sure value: 90
            ("B", 85.0, 80.0, 95.0, 100, 100),  # reaches 90: kept
            ("C", 70.0, 60.0, 80.0, 100, 100),  # cannot reach it: dropped
            ("D", math.nan, 0.0, 120.0, 100, 100),  # outside the domain, may beat it: kept
            ("E", 200.0, 190.0, 210.0, 5000, 6000),  # best, but surely misses the TTFT limit
        ]
    )
    chosen, why = select(df, "throughput", {"max_ttft_p99_ms": 1000})
    assert list(chosen.split) == ["D", "A", "B"] and "90.0" in why
    top, why = select(df, "throughput", {"max_ttft_p99_ms": 1000}, keep=1)
    assert list(top.split) == ["D"] and "the 1 best" in why
    with pytest.raises(pipesim.UserError, match="no plan can meet"):
        select(df, "throughput", {"max_ttft_p99_ms": 10})


def test_a_capped_budget_simulates_one_plan_of_each_figure_first(monkeypatch):
    """Plans the model cannot tell apart (the same figure: a knob that does not move its
    estimate, or the same output path's pace) are simulated after one of each: with
    three simulations, A1, B and C, not A1, A2, A3."""
    monkeypatch.setattr("pipesim.explore.screen.model_error", lambda: NO_ERROR)
    df = _plans(
        [
            ("A1", 100.0, 100.0, 100.0, 100, 100),
            ("A2", 100.0, 100.0, 100.0, 100, 100),
            ("A3", 100.0 * (1 + 2e-4), 100.0, 100.0, 100, 100),  # within 0.1%: the same figure
            ("B", 99.0, 99.0, 99.0, 100, 100),
            ("C", 98.0, 98.0, 98.0, 100, 100),
        ]
    )
    df.loc[:, "model_output_throughput_tok_s_hi"] = 101.0  # every band reaches the best sure value
    chosen, why = select(df, "throughput", {})
    assert list(chosen.split) == ["A3", "A1", "A2", "B", "C"]  # uncapped: by the point
    top, why = select(df, "throughput", {}, keep=3)
    assert list(top.split) == ["A3", "B", "C"] and "one of each figure first" in why


def test_bands_widen_the_bracket_by_the_measured_error():
    df = _plans([("A", 100.0, 90.0, 110.0, 100, 200)])
    b = bands(df, {"output_throughput_tok_s": 0.1, "ttft_ms": 0.5, "tpot_ms": 0.0})
    assert b.band_output_throughput_tok_s_lo[0] == pytest.approx(90 / 1.1)
    assert b.band_output_throughput_tok_s_hi[0] == pytest.approx(110 * 1.1)
    assert b.band_ttft_ms_lo[0] == pytest.approx(100 / 1.5) and b.band_ttft_ms_hi[0] == pytest.approx(300)


def test_two_stages_name_the_winner_simulating_everything_names(profile):
    """A grid small enough to simulate whole: 2 splits x 2 running caps x 2 loads. The
    two-stage search simulates no more of them and picks the plan and load that the
    search of every plan simulated picks."""
    common = dict(splits=[(8, 1), (2, 4)], profile=profile, model="llama-3.1-70b", workers=1, **SHORT)
    staged = pipesim.search(8, "throughput", [2, 8], screen=True, running_caps=[4, 16], **common)
    tables = []
    for cap in (4, 16):
        t = pipesim.sweep(8, [2, 8], max_running_requests=cap, **common)
        tables.append(t.assign(split=t.split + f" [cap {cap}]"))
    full = pipesim.search(table=pd.concat(tables, ignore_index=True), objective="throughput")
    assert len(staged.table) <= 8 and staged.screen.startswith("two-stage")
    assert (staged.winner.split, staged.winner.conc) == (full.winner.split, full.winner.conc)


def test_knob_lists_belong_to_a_two_stage_search(profile):
    with pytest.raises(pipesim.UserError, match="two-stage"):
        pipesim.search(gpus=8, conc=[2], running_caps=[4], profile=profile, workers=1, **SHORT)
    with pytest.raises(pipesim.UserError, match="both set the same knob"):
        pipesim.search(
            gpus=8, conc=[2], screen=True, running_caps=[4], max_running_requests=8, profile=profile, **SHORT
        )

"""An open loop's band from its own stretches (measure/stretches.py): the samples by hand,
the spread's rule, a trace's pinned workload, the ensemble's runs counted in the work bound,
and the estimate against the spread of the same run over seeds."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import SHORT_LLAMA as FAST

import pipesim
from pipesim.base.errors import UserError
from pipesim.measure.stretches import STRETCHES, StretchTally, spread, stretch_count
from pipesim.report import uncertainty as U
from pipesim.scenario.build import build_scenario, scenario_steps


def test_stretches_are_blocks_of_consecutive_arrivals_by_hand():
    # 8 requests in 4 stretches of 2; request i arrives at i s, finishes in any order
    t = StretchTally(8)
    assert t.k == 4  # two requests a stretch at least
    for i in reversed(range(8)):
        t.add(
            i,
            float(i + 1),
            ttft_ms=10.0 * (i + 1),
            tpot_ms=None if i == 0 else 2.0,
            decode_tok_s=50.0,
            out=100,
        )
    s = t.samples(0.0)
    # stretch 0: arrivals at 1 and 2 s, since the window's start: 200 tokens / 2 s;
    # the others: 200 tokens over the 2 s since the previous stretch's last arrival
    assert s["output_throughput_tok_s"] == [100.0, 100.0, 100.0, 100.0]
    assert s["ttft_ms_p50"] == [15.0, 35.0, 55.0, 75.0]
    assert s["ttft_ms_p99"] == pytest.approx([19.9, 39.9, 59.9, 79.9])
    assert s["tpot_ms_p50"] == [2.0] * 4 and s["per_request_tok_s"] == [50.0] * 4


def test_stretch_count_keeps_two_requests_a_stretch():
    assert stretch_count(1000) == STRETCHES
    assert stretch_count(10) == 5 and stretch_count(3) == 0


def test_spread_is_the_successive_differences_sigma_over_root_k():
    # a stationary alternation: sigma^2 = sum of 3 squared differences of 2 / 2(k - 1) = 2
    x = [9.0, 11.0, 9.0, 11.0]
    assert spread(x, 1.0) == pytest.approx(math.sqrt(12 / 6) / 2 / 10)
    # a steady climb is a run filling up, not a spread: the differences are equal
    climb = [1.0, 2.0, 3.0, 4.0]
    assert spread(climb, 1.0) == pytest.approx(math.sqrt(3 / 6) / 2 / 2.5)
    assert spread(climb, 1.0) < np.std(climb, ddof=1) / 2 / 2.5
    assert spread([5.0], 1.0) == 0.0 and spread([float("nan"), 1.0], 1.0) == 0.0


def test_a_trace_runs_no_ensemble_its_workload_is_pinned(monkeypatch, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival_s,input_tokens,output_tokens\n" + "".join(f"{i * 0.1},64,8\n" for i in range(20))
    )
    from pipesim.sim import runner

    real, runs = runner.run, []
    monkeypatch.setattr(runner, "run", lambda *a, **k: runs.append(1) or real(*a, **k))
    r = pipesim.predict(1, 1, model="llama-3.1-8b", trace=str(trace), intervals=True, ensemble=True)
    assert runs == []  # the ensemble's members would replay the same trace: none run
    assert all(p["workload"] == 0 for p in r.interval_basis["parts"].values())
    assert "pins" in r.interval_basis["workload"]


def test_the_ensemble_runs_are_counted_in_the_work_bound(monkeypatch):
    """A prediction whose run fits the bound but whose run and ensemble together do not
    is refused before any simulation."""
    import pipesim.base.checks as checks
    from pipesim import api

    sc = build_scenario(tp=1, pp=1, concurrency=8, **FAST)
    steps = scenario_steps(sc)[0]
    members = sum(scenario_steps(m)[0] for m in U.ensemble_scenarios(sc))
    monkeypatch.setattr(checks, "MAX_BATCH_STEPS", steps + members / 2)
    monkeypatch.setattr(api, "run_scenario", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(UserError, match="ensemble runs"):
        api.run(sc, intervals="ensemble")


def test_the_run_estimate_is_near_the_spread_over_seeds():
    """One open loop's estimate against the figures of the same loop with ten seeds:
    within a factor of 2.5 either way for every headline figure (a spread estimated
    from eight stretches, itself noisy at about 25%)."""
    sc = build_scenario(
        tp=2, rate_rps=5.0, num_requests=300, model="llama-3.1-8b", input_len="200", output_len="100"
    )
    runs = [pipesim.run(replace(sc, workload=replace(sc.workload, seed=s))) for s in range(10)]
    est = U.run_spread(runs[0], sc)
    for m in U.HEADLINE:
        v = np.array([getattr(r, m) for r in runs])
        over_seeds = U.Z_LIKELY * v.std(ddof=1) / v.mean()
        assert over_seeds / 2.5 <= est[m] <= over_seeds * 2.5, m

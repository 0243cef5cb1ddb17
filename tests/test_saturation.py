"""Saturation of open-loop runs: the rates and the rule on hand-built request times,
and on simulated runs well below and well above the engine's closed-loop capacity."""

import json

import numpy as np
import pytest
from conftest import fast_predict

from pipesim.measure.saturation import GROWTH_SHARE, saturation


def test_stable_queue_keeps_up():
    """One arrival per second, each done 2 s later: 1 req/s in, 1 out, two in the engine."""
    arr = np.arange(100.0)
    s = saturation(arr, arr + 0.5, arr + 2.0)
    assert abs(s.arrival_rate_req_s - 1.0) < 1e-9
    assert abs(s.served_rate_req_s - 1.0) < 0.03
    assert abs(s.queue_growth_req_s) < 0.02 and not s.overloaded
    # at the last arrival (99 s): 98 and 99 in the engine, 99 without its first token (at 99.5 s)
    assert s.in_engine_end == 2 and s.waiting_at_last_arrival == 1


def test_server_at_half_the_arrival_rate_is_overloaded():
    """2 req/s into a single server that finishes one a second (first come first
    served): the queue gains 1 request per second, half of the arrival rate."""
    arr = np.arange(200) * 0.5
    fin = 1.0 + np.arange(200) * 1.0  # the k-th finishes at 1 + k s (server never idles)
    first = fin - 0.9  # starts 0.1 s after the previous one finished
    s = saturation(arr, first, fin)
    assert abs(s.arrival_rate_req_s - 2.0) < 1e-9
    assert abs(s.served_rate_req_s - 1.0) < 0.05
    assert abs(s.queue_growth_req_s - 1.0) < 0.05
    assert s.overloaded and s.queue_growth_req_s > GROWTH_SHARE * s.arrival_rate_req_s
    assert abs(s.arrival_rate_half_req_s - 2.0) < 0.05  # evenly spaced: the same in each half
    assert s.text().startswith("overloaded: 2.00 req/s arrive; over the second half of the arrivals 2.0")
    # at the last arrival (99.5 s) the k-th has its first token at 0.1 + k s: k = 0..99
    assert s.waiting_at_last_arrival == 200 - 100


def test_too_few_requests_give_no_verdict():
    assert saturation([0.0, 1.0], [0.1, 1.1], [0.5, 1.5]) is None
    assert saturation([3.0, 3.0, 3.0], [3.1] * 3, [4.0] * 3) is None


def test_simulated_runs_below_and_above_capacity(profile):
    """TP8 x PP1 serves about 3 req/s at 64 clients (its running cap): at 0.5 req/s it
    keeps up; at 8 req/s it cannot serve more than a closed loop at the cap does."""
    kw = dict(tp=8, pp=1, model="kimi-k2.6", num_requests=150)
    cap = fast_predict(profile, tp=8, pp=1, conc=64, measure_requests=128)
    low = fast_predict(profile, rate_rps=0.5, **kw)
    high = fast_predict(profile, rate_rps=8.0, **kw)
    assert not low.saturation["overloaded"] and "keeps up" in low.saturation["text"]
    assert high.saturation["overloaded"]
    assert high.saturation["served_rate_req_s"] <= 1.15 * cap.request_throughput_req_s
    grow = high.saturation["arrival_rate_req_s"] - high.saturation["served_rate_req_s"]
    assert grow > 0.5 * high.saturation["arrival_rate_req_s"]
    assert json.loads(json.dumps(high.to_dict()))["saturation"]["overloaded"] is True
    assert cap.saturation is None  # a closed loop is never overloaded: clients wait


def test_table_says_overloaded(profile):
    from pipesim.report import table as report

    r = fast_predict(profile, tp=8, pp=1, rate_rps=8.0, num_requests=120)
    line = [x for x in report.table(r).splitlines() if "req/s arrive" in x]
    assert line and "overloaded:" in line[0]


def test_the_second_half_arrival_rate_counts_the_arrivals_in_it():
    """A Poisson run's second half brings its own number of arrivals: the rate served
    and growth are read against is that count over the half's length, counted here
    directly from the arrival times."""
    rng = np.random.default_rng(7)
    arr = np.cumsum(rng.exponential(0.5, 300))
    fin = arr + rng.uniform(1.0, 3.0, 300)
    s = saturation(arr, fin - 0.5, fin)
    mid = (arr[0] + arr[-1]) / 2
    inside = np.sum((arr > mid) & (arr <= arr[-1]))
    assert s.arrival_rate_half_req_s == pytest.approx(inside / (arr[-1] - mid), abs=1.0 / (arr[-1] - mid))

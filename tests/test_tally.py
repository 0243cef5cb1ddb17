"""Metrics accumulated as the run goes (tally.py, request_tally.py): folding a run's
rows a stretch at a time gives the figures of one pass over every row, wherever the
cuts fall; a summary run holds a bounded number of rows and no finished request; the
streamed figures (saturation, percentiles, the token-rate histogram) agree with their
definitions on the whole data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import profile_for, small_kv_scenario
from conftest import simulate as simulate_by_hand
from hypothesis import given, settings
from hypothesis import strategies as st

import pipesim
import pipesim.inputs.workload as workload
import pipesim.sim.simulation as simulation
from pipesim.base.errors import UserError
from pipesim.measure.metrics import idle_breakdown
from pipesim.measure.record import fold
from pipesim.measure.rows import Batch, Recorder, TokenReturn
from pipesim.measure.saturation import saturation
from pipesim.measure.sketch import REL_ERROR, Percentiles, percentile
from pipesim.measure.steady import TimeHistogram, window_ci
from pipesim.measure.tally import BUBBLE_MIN_S, StepTally, covered_s, gaps, merge
from pipesim.sim.runner import simulate

# ---- a summary run reports what a run that keeps every row reports -----------------


def _scenarios():
    kimi = dict(model="kimi-k2.6", input_len="64:200", output_len="8:40")
    llama = dict(model="llama-3.1-8b", input_len="64:300", output_len="8:60")
    return {
        "TP8": dict(tp=8, concurrency=16, **kimi),
        "TP2xPP4, shared links": dict(tp=2, pp=4, concurrency=24, **kimi),
        "PP8, async depth 2": dict(tp=1, pp=8, concurrency=16, pp_async_batch_depth=2, **kimi),
        "vLLM PP4, in-flight groups": dict(
            tp=2, pp=4, concurrency=16, engine="vllm", profile=profile_for("vllm"), **llama
        ),
        "DP2 attention, lock step": dict(
            tp=2, dp=2, dp_attention=True, concurrency=16, model="qwen3-30b-a3b", output_len="8:40"
        ),
        "vLLM DP2 replicas": dict(
            tp=1, dp=2, concurrency=16, engine="vllm", profile=profile_for("vllm"), **llama
        ),
        "queued above the cap": dict(tp=8, concurrency=40, max_running_requests=8, **kimi),
        "Poisson, overloaded": dict(tp=2, pp=2, rate_rps=40.0, num_requests=120, **llama),
        "Poisson, keeps up": dict(tp=8, rate_rps=2.0, num_requests=60, **kimi),
    }


def _compare(a: dict, b: dict, path: str = "") -> list[str]:
    """Paths where two to_dict() trees differ beyond float summation order."""
    out = []
    for k in set(a) | set(b):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _compare(x, y, f"{path}.{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            out += [f"{path}.{k}" for p, q in zip(x, y) if _compare({"v": p}, {"v": q})]
        elif isinstance(x, float) and isinstance(y, float):
            if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12):
                out.append(f"{path}.{k}: {x} vs {y}")
        elif x != y:
            out.append(f"{path}.{k}: {x!r} vs {y!r}")
    return out


@pytest.mark.parametrize("name", list(_scenarios()))
def test_summary_run_reports_what_a_full_run_reports(monkeypatch, name):
    """Folded every 7 token returns (dozens of cuts, through busy and idle stretches,
    before and after the warm-up's end) against one pass over every row: every
    figure the same, to float summation order."""
    sc = pipesim.build_scenario(**_scenarios()[name])
    rec_full, full = simulate(sc, ci_target=None, record="full")
    monkeypatch.setattr(simulation, "FOLD_RETURNS", 7)
    rec_sum, summ = simulate(sc, ci_target=None, record="summary")
    assert len(rec_full.tokens) > 10 * 7  # the summary run did fold many times
    assert not rec_sum.tokens and not any(rec_sum.compute)  # and kept no row
    a, b = full.to_dict(), summ.to_dict()
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert _compare(a, b) == []
    assert [vars(s) for s in idle_breakdown(rec_full)] == [
        pytest.approx(vars(s), rel=1e-9, abs=1e-12) for s in idle_breakdown(rec_sum)
    ]
    assert rec_sum.steps.visits == rec_full.steps.visits >= sum(len(c) for c in rec_full.compute)


def test_a_trace_replay_summary_equals_full(monkeypatch, tmp_path):
    rng = np.random.default_rng(11)
    trace = tmp_path / "trace.csv"
    rows = zip(np.cumsum(rng.exponential(0.05, 80)), rng.integers(20, 400, 80), rng.integers(2, 60, 80))
    trace.write_text(
        "arrival_s,input_tokens,output_tokens\n" + "".join(f"{a:.4f},{i},{o}\n" for a, i, o in rows)
    )
    sc = pipesim.build_scenario(
        model="llama-3.1-8b", tp=2, trace=str(trace), engine="vllm", profile=profile_for("vllm")
    )
    _, full = simulate(sc, record="full")
    monkeypatch.setattr(simulation, "FOLD_RETURNS", 5)
    _, summ = simulate(sc, record="summary")
    a, b = full.to_dict(), summ.to_dict()
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert _compare(a, b) == []


def test_kv_evictions_are_counted_alike(monkeypatch):
    """Retractions (SGLang) in a run whose KV pool holds a few requests."""
    sc = small_kv_scenario("sglang")
    _, full = simulate(sc, ci_target=None, record="full")
    monkeypatch.setattr(simulation, "FOLD_RETURNS", 3)
    _, summ = simulate(sc, ci_target=None, record="summary")
    assert full.preemptions_total > 0
    assert (summ.preemptions, summ.preemptions_total) == (full.preemptions, full.preemptions_total)


def test_a_summary_run_holds_a_bounded_number_of_rows(monkeypatch):
    """An open loop of 400 requests folded every 16 returns: the recorder never holds
    more than 16 token returns, the rows of the steps in flight, and no request once it
    has finished (only the ones in the engine: their number, not the run's, bounds it)."""
    monkeypatch.setattr(simulation, "FOLD_RETURNS", 16)
    sc = pipesim.build_scenario(model="llama-3.1-8b", tp=2, rate_rps=20.0, num_requests=400, output_len="20")
    peak = {"tokens": 0, "compute": 0}

    def watch_rows(sim):
        complete = sim.complete

        def watch(mb):
            peak["tokens"] = max(peak["tokens"], len(sim.rec.tokens))
            peak["compute"] = max(peak["compute"], len(sim.rec.compute[0]))
            return complete(mb)

        sim.complete = watch

    sim = simulate_by_hand(sc, 0, 400, setup=watch_rows, record="summary")
    assert sim.completed == 400 and sim.requests is None
    assert sim.done.rows() is None
    assert peak["tokens"] <= 16 and peak["compute"] <= 16 + 2
    rec = sim.record()
    assert rec.requests.measured == 400 and not rec.kept


def test_requests_of_a_summary_open_loop_say_how_to_keep_them():
    r = pipesim.predict(
        8, 1, model="llama-3.1-8b", rate_rps=5.0, num_requests=20, output_len="10", intervals=False
    )
    with pytest.raises(UserError, match=r"record='full'\) keeps them"):
        _ = r.requests
    closed = pipesim.predict(8, 1, 4, model="llama-3.1-8b", output_len="10", ci_target=None, intervals=False)
    assert len(closed.requests) == closed.completed_requests  # a closed loop keeps its rows
    full = pipesim.predict(
        8,
        1,
        model="llama-3.1-8b",
        rate_rps=5.0,
        num_requests=20,
        output_len="10",
        record="full",
        intervals=False,
    )
    assert len(full.requests) == 20 and full.ttft_ms_p99 == r.ttft_ms_p99


def test_unknown_record_mode_is_refused():
    sc = pipesim.build_scenario(tp=8, concurrency=1)
    with pytest.raises(UserError, match="record 'some' is not one of summary, full"):
        simulate(sc, record="some")


def test_a_run_that_never_ends_its_warm_up_has_no_window(profile):
    """The horizon reached before the warm-up is over: the window is empty (not the
    warm-up's requests measured as if they were the steady state)."""
    sc = pipesim.build_scenario(tp=8, concurrency=4, output_len="50", profile=profile)
    sim = simulate_by_hand(sc, 10_000, 16, max_sim_s=5.0)
    assert sim.completed > 0
    rec = sim.record()
    assert rec.window_s == (rec.end_s, rec.end_s) and rec.requests.measured == 0


# ---- folding hand-made rows at random cuts ----------------------------------------


@st.composite
def rows_and_cuts(draw):
    """Two stages' busy rows (compute then a collective, FIFO), hops between them, CPU
    rows and link waits, on a grid of quarter seconds (so that rows touch, cuts fall
    on row ends and idle stretches cross cuts), and cut times in increasing order."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = 0.25
    rows = {"compute": [[], []], "comm": [[], []], "hops": [[], []], "cpu": [], "link_wait": []}
    for s in range(2):
        t = q * rng.integers(0, 4)
        for _ in range(rng.integers(0, 12)):
            a = t + q * rng.integers(0, 3)
            b = a + q * rng.integers(1, 4)
            rows["compute"][s].append((a, b))
            if rng.random() < 0.5:
                rows["comm"][s].append((b, b + q * rng.integers(0, 2)))
                b = rows["comm"][s][-1][1]
            if rng.random() < 0.7:
                rows["hops"][s].append((b, b + q * rng.integers(1, 3)))
            t = b
    for name in ("cpu", "link_wait"):
        for _ in range(rng.integers(0, 6)):
            a = q * rng.integers(0, 40)
            rows[name].append((a, a + q * rng.integers(0, 3)))
        rows[name].sort()
    end = q * 48
    cuts = sorted({float(c) for c in q * rng.integers(1, 48, size=rng.integers(0, 8))} | {end})
    t0 = draw(st.sampled_from([0.0, 1.0, 2.125, 6.0]))
    return rows, cuts, t0


def _recorder(rows, predicate):
    rec = Recorder(2)
    for s in range(2):
        for name in ("compute", "comm", "hops"):
            getattr(rec, name)[s].extend(r for r in rows[name][s] if predicate(r))
    rec.cpu.extend(r for r in rows["cpu"] if predicate(r))
    rec.link_wait.extend(r for r in rows["link_wait"] if predicate(r))
    return rec


@settings(max_examples=150, deadline=None)
@given(rows_and_cuts())
def test_folding_at_any_cuts_gives_the_one_pass_figures(case):
    """Rows reach the recorder at or before their start (the simulation's rule): before
    the cut at c every row starting before c is in; then the fold. Against one pass
    over all rows: the same busy, covered and idle figures, bubbles counted once."""
    rows, cuts, t0 = case
    whole = StepTally(2, 1)
    fold(_recorder(rows, lambda r: True), whole, cuts[-1], t0, final=True, drop=False)
    folded, rec, given = StepTally(2, 1), Recorder(2), set()
    for i, c in enumerate(cuts):
        final = i == len(cuts) - 1

        # every row starting before the cut has arrived, and some booked ahead of it
        def due(k, r, c=c, final=final):
            return r[0] < c or final or (k % 3 == 0 and r[0] < c + 2.0)

        for s in range(2):
            for name in ("compute", "comm", "hops"):
                for k, r in enumerate(rows[name][s]):
                    if (name, s, k) not in given and due(k, r):
                        given.add((name, s, k))
                        getattr(rec, name)[s].append(r)
        for name in ("cpu", "link_wait"):
            for k, r in enumerate(rows[name]):
                if (name, k) not in given and due(k, r):
                    given.add((name, k))
                    getattr(rec, name).append(r)
        for name in ("compute", "comm", "hops"):  # FIFO per stage, as the pipeline appends
            for s in range(2):
                getattr(rec, name)[s].sort()
        fold(rec, folded, c, t0 if t0 < c or final else None, final=final)
    for attr in ("compute_s", "comm_s", "hop_s", "bubble_s"):
        assert getattr(folded, attr) == pytest.approx(getattr(whole, attr), abs=1e-9), attr
    assert folded.bubbles == whole.bubbles
    assert [pytest.approx(c, abs=1e-9) for c in whole.covered] == folded.covered
    assert (folded.cpu_s, folded.link_wait_s) == pytest.approx((whole.cpu_s, whole.link_wait_s), abs=1e-9)
    # and the one pass is the interval arithmetic of the window
    lo, hi = t0, cuts[-1]
    for s in range(2):
        busy = rows["compute"][s] + rows["comm"][s]
        idle = gaps(merge(busy, lo, hi), lo, hi) if hi > lo else np.zeros((0, 2))
        assert whole.bubbles[s] == len(idle)
        assert whole.covered[s][2] == pytest.approx(covered_s(busy, lo, hi), abs=1e-12)


def test_an_idle_stretch_cut_three_times_is_one_bubble():
    """Stage busy [0, 1] and [9, 10]; cuts at 3, 5 and 7 fall inside its one idle
    stretch [1, 9]: one bubble of 8 s, as in one pass."""
    rec = Recorder(1)
    rec.compute[0] += [(0.0, 1.0), (9.0, 10.0)]
    tally = StepTally(1, 1)
    for c in (3.0, 5.0, 7.0):
        fold(rec, tally, c, 0.0)
    fold(rec, tally, 10.0, 0.0, final=True)
    assert (tally.bubbles, tally.bubble_s) == ([1], [pytest.approx(8.0)])
    assert tally.compute_s == [pytest.approx(2.0)]


def test_a_bubble_shorter_than_the_noise_floor_split_by_a_cut_is_not_counted():
    rec = Recorder(1)
    rec.compute[0] += [(0.0, 1.0), (1.0 + 0.6 * BUBBLE_MIN_S, 2.0)]
    tally = StepTally(1, 1)
    fold(rec, tally, 1.0 + 0.3 * BUBBLE_MIN_S, 0.0)
    fold(rec, tally, 2.0, 0.0, final=True)
    assert tally.bubbles == [0]


def test_points_count_by_the_window_rules():
    """Tokens and evictions in (t0, t1], batches launched in [t0, t1]; the point at the
    cut goes with the stretch after it."""
    rec = Recorder(1)
    rec.tokens += [TokenReturn(1.0, 5), TokenReturn(2.0, 7), TokenReturn(3.0, 11)]
    rec.batches += [Batch(1.0, 0, 4, "decode"), Batch(2.0, 0, 6, "decode"), Batch(2.5, 0, 3, "prefill")]
    rec.evictions += [(2.0, 1), (2.5, 2)]
    tally = StepTally(1, 1)
    fold(rec, tally, 2.0, None)  # the warm-up: its end not yet known (it comes at 2.0)
    fold(rec, tally, 3.0, 2.0, final=True)
    assert tally.tokens == 11  # the return at t0 = 2.0 is not in (2.0, 3.0]
    assert (tally.batches, tally.batch_requests, tally.decode_requests) == (2, 9, 6)
    assert (tally.evictions, tally.evictions_total) == (1, 2)
    assert tally.window_s == (2.0, 3.0)


# ---- streamed figures against their definitions ---------------------------------------


def _saturation_by_definition(arr, first, fin):
    """saturation.py's rule on whole arrays: the count at every arrival and finish of
    the second half and at its ends, its slope by np.polyfit."""
    arr, first, fin = np.sort(arr), np.sort(first), np.sort(fin)
    n, a0, a1 = len(arr), arr[0], arr[-1]
    mid = (a0 + a1) / 2

    def by(times, t):
        return int(np.searchsorted(times, t, side="right"))

    t = np.unique(
        np.concatenate((arr[(arr >= mid) & (arr <= a1)], fin[(fin >= mid) & (fin <= a1)], [mid, a1]))
    )
    count = np.searchsorted(arr, t, side="right") - np.searchsorted(fin, t, side="right")
    return dict(
        rate=(n - 1) / (a1 - a0),
        served=(by(fin, a1) - by(fin, mid)) / (a1 - mid),
        growth=float(np.polyfit(t, count, 1)[0]),
        mid=by(arr, mid) - by(fin, mid),
        end=by(arr, a1) - by(fin, a1),
        waiting=n - by(first, a1),
    )


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_streamed_saturation_is_the_least_squares_of_the_whole_run(seed, ties):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    arr = np.cumsum(rng.exponential(1 / rng.uniform(0.5, 20), n))
    lat = rng.exponential(rng.uniform(0.1, 5), n) * (1 + np.arange(n) * rng.uniform(0, 0.05))
    fin = arr + lat
    first = arr + lat * rng.uniform(0.05, 1.0, n)
    if ties:  # many events at one instant
        arr, fin = np.round(arr, 1), np.round(fin, 1)
        first = np.minimum(np.round(first, 1), fin)
    if arr.max() <= arr.min():
        return
    s = saturation(arr, first, fin)
    d = _saturation_by_definition(arr, first, fin)
    assert s.arrival_rate_req_s == pytest.approx(d["rate"], rel=1e-12)
    assert s.served_rate_req_s == pytest.approx(d["served"], rel=1e-12)
    assert s.queue_growth_req_s == pytest.approx(d["growth"], rel=1e-7, abs=1e-9)
    assert (s.in_engine_mid, s.in_engine_end, s.waiting_at_last_arrival) == (d["mid"], d["end"], d["waiting"])


def test_percentiles_are_exact_up_to_the_limit_then_within_the_bound():
    rng = np.random.default_rng(7)
    x = rng.lognormal(3, 1.5, 5000)
    p = Percentiles(exact_values=1000)
    for v in x[:1000]:
        p.add(float(v))
    assert (
        p.exact and p.percentile(99) == percentile(x[:1000], 99) and p.mean == pytest.approx(x[:1000].mean())
    )
    for v in x[1000:]:
        p.add(float(v))
    assert not p.exact and p.count == 5000
    for q in (50, 90, 99, 99.9):
        assert p.percentile(q) == pytest.approx(percentile(x, q), rel=REL_ERROR)
    assert p.mean == pytest.approx(x.mean(), rel=1e-12)


def test_token_histogram_exact_then_binned():
    """Kept points: window_ci itself. Binned: the mean exact; each span's tokens off by
    at most the tokens of the bins its two edges cut (the module's stated bound)."""
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 100, 3000))
    w = rng.integers(1, 64, 3000).astype(float)
    exact = TimeHistogram(exact_points=10_000)
    binned = TimeHistogram(exact_points=100, bins=512)
    for a, b in zip(t, w):
        exact.add(float(a), float(b))
        binned.add(float(a), float(b))
    assert exact.exact and not binned.exact
    assert exact.window_ci(0.0, 100.0) == window_ci(np.column_stack((t, w)), 0.0, 100.0)
    mean, half = binned.window_ci(0.0, 100.0)
    ref_mean, ref_half = window_ci(np.column_stack((t, w)), 0.0, 100.0)
    assert mean == pytest.approx(ref_mean, rel=1e-12)
    assert half > 0 and ref_half > 0
    # each span's tokens counted exactly, against the bins: within the heaviest bin at
    # the bins' final width, once per edge
    spans = np.histogram(t, bins=np.linspace(0.0, 100.0, 11), weights=w)[0]
    heaviest = np.histogram(t, bins=np.arange(0.0, 100.0 + 2 * binned.bin_s, binned.bin_s), weights=w)[
        0
    ].max()
    assert np.abs(binned.span_weights(0.0, 100.0) - spans).max() <= 2 * heaviest


def test_constant_rate_binned_has_near_zero_width():
    h = TimeHistogram(exact_points=10, bins=256)
    for t in np.arange(0.05, 100, 0.1):
        h.add(float(t), 5.0)
    mean, half = h.window_ci(0.0, 100.0)
    assert mean == pytest.approx(50.0) and half < 0.01 * mean


def test_poisson_arrivals_drawn_in_chunks_are_the_one_draw(monkeypatch):
    """The arrival gaps, drawn in chunks as the run goes, are the numbers one draw of
    all of them gives; the planned first and last arrival are the run's."""
    monkeypatch.setattr(workload, "ARRIVAL_CHUNK", 7)
    sc = pipesim.build_scenario(
        tp=8, model="llama-3.1-8b", rate_rps=50.0, num_requests=40, output_len="4", seed=5
    )
    sim = simulate_by_hand(sc, 0, 40)
    want = np.cumsum(np.random.default_rng(5).exponential(1 / 50.0, size=40))
    got = np.array([r.arrival_s for r in sorted(sim.requests, key=lambda r: r.rid)])
    assert got == pytest.approx(want, rel=1e-12)
    assert sim.frontend.plan.span_s == (got[0], got[-1])


def test_sketched_percentiles_say_so(monkeypatch, capsys):
    """An open loop measuring more requests than pipesim keeps values of (here 50, for
    a short run) reports its percentiles within the sketch's stated error of the exact
    ones, and its table says so; below the limit they are exact and the table is silent."""
    import pipesim.measure.sketch as sketch
    from pipesim.cli import main

    kw = dict(model="llama-3.1-8b", rate_rps=20.0, num_requests=120, output_len="10:30")
    exact = pipesim.predict(8, 1, record="full", **kw, intervals=False)
    assert exact.percentile_rel_error == 0.0
    assert exact.ttft_ms_p99 == percentile(exact.requests.ttft_ms, 99)
    monkeypatch.setattr(sketch, "EXACT_VALUES", 50)
    r = pipesim.predict(8, 1, record="full", **kw, intervals=False)
    assert r.percentile_rel_error == REL_ERROR
    for col, p in (("ttft_ms", r.ttft_ms_p99), ("tpot_ms", r.tpot_ms_p50)):
        q = 99 if col == "ttft_ms" else 50
        assert p == pytest.approx(percentile(r.requests[col].dropna(), q), rel=REL_ERROR)
    main(["predict", "--tp", "8", "--rate", "20", "--num-requests", "120", "--model", "llama-3.1-8b"])
    assert "percentiles within 0.5%" in capsys.readouterr().out

"""The batches in flight by position (measure/occupancy.py): a schedule worked by hand,
the same figures wherever the folds cut, invariants on random schedules, and what they
show on the splits the issue is about."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipesim
from pipesim.measure.occupancy import Occupancy, occupancy_steps, ordinal
from pipesim.measure.record import fold
from pipesim.measure.rows import Batch, Recorder, TokenReturn
from pipesim.measure.tally import StepTally
from pipesim.sim.runner import simulate

# ---- a schedule worked by hand ---------------------------------------------------------

# Three slots. Launches (time, slot, requests): A (0, 0, 5), B (1, 1, 2), C (3, 0, 4),
# D (5, 2, 7), E (9, 2, 1); returns in launch order at 3, 4, 6, 9 (E still out at the
# stop, 10). At 3 C launches as A returns, at 9 E as D returns.
HAND_BATCHES = [(0.0, 0, 5), (1.0, 1, 2), (3.0, 0, 4), (5.0, 2, 7), (9.0, 2, 1)]
HAND_RETURNS = [3.0, 4.0, 6.0, 9.0]


def _hand_rows() -> Recorder:
    rec = Recorder(3)
    rec.batches += [Batch(t, s, n, "decode") for t, s, n in HAND_BATCHES]
    rec.tokens += [TokenReturn(t, n) for t, (_, _, n) in zip(HAND_RETURNS, HAND_BATCHES)]
    return rec


def test_a_schedule_worked_by_hand():
    """Window [2, 10]: in flight {5, 2} on [2, 3), {4, 2} on [3, 4), {4} on [4, 5),
    {7, 4} on [5, 6), {7} on [6, 9), {1} on [9, 10]. The fullest: 5 + 4 + 4 + 7 + 3 x 7
    + 1 = 42 request-seconds over 8 s, 5.25; the second: 2 + 2 + 4 = 8, 1.0; the third
    never. Empty: the first never, the second on [4, 5) and [6, 10], 5 of 8 s; the
    third always. Folded at 2 (the warm-up's end not yet known) and at 4.5."""
    rec, tally = _hand_rows(), StepTally(3, 3)
    fold(rec, tally, 2.0, None)
    fold(rec, tally, 4.5, 2.0)
    fold(rec, tally, 10.0, 2.0, final=True)
    occ = tally.occupancy
    assert occ.means(8.0) == pytest.approx([5.25, 1.0, 0.0])
    assert occ.empty_shares(8.0) == pytest.approx([0.0, 0.625, 1.0])
    assert occ.count_s == pytest.approx([0.0, 5.0, 3.0, 0.0])  # seconds with 0, 1, 2, 3 in flight


def test_the_hand_schedule_as_the_trace_steps_it():
    steps = list(occupancy_steps(_hand_rows().batches, _hand_rows().tokens, 3))
    # at a tie the launch goes first: C joins A and B for an instant, E joins D
    assert steps == [
        (0.0, [5, 0, 0]),
        (1.0, [5, 2, 0]),
        (3.0, [5, 4, 2]),
        (3.0, [4, 2, 0]),
        (4.0, [4, 0, 0]),
        (5.0, [7, 4, 0]),
        (6.0, [7, 0, 0]),
        (9.0, [7, 1, 0]),
        (9.0, [1, 0, 0]),
    ]


def test_an_empty_engine_before_its_first_launch_counts_as_empty():
    """An open loop's window starts at 0; nothing is in flight until the first launch
    at 1: every position is empty for that second."""
    rec = Recorder(1)
    rec.batches.append(Batch(1.0, 0, 3, "prefill"))
    rec.tokens.append(TokenReturn(2.0, 3))
    tally = StepTally(1, 1)
    fold(rec, tally, 4.0, 0.0, final=True)
    assert tally.occupancy.means(4.0) == [pytest.approx(0.75)]
    assert tally.occupancy.empty_shares(4.0) == [pytest.approx(0.75)]


def test_ordinals():
    assert [ordinal(k) for k in (1, 2, 3, 4, 11)] == ["1st", "2nd", "3rd", "4th", "11th"]


# ---- random schedules -------------------------------------------------------------------


@st.composite
def schedules(draw):
    """A pipeline's batches: up to `positions` in flight, each returned after its launch
    and after the batch before it (launch order), on a grid of quarter seconds (so that
    launches, returns, the window's start and cuts tie); a window start and cuts."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    positions = int(rng.integers(1, 6))
    q = 0.25
    launches, returns, t, last_return = [], [], 0.0, 0.0
    for _ in range(int(rng.integers(0, 30))):
        t += q * int(rng.integers(0, 3))
        out = [r for r in returns if r > t]
        if len(out) >= positions:  # every position taken: the next waits for a return
            t = out[-positions]
        r = max(t, last_return) + q * int(rng.integers(0, 8))
        launches.append((t, int(rng.integers(0, positions)), int(rng.integers(1, 65))))
        returns.append(r)
        last_return = r
    end = max([t, *returns]) + q * int(rng.integers(0, 4))
    cut = sorted({float(c) for c in q * rng.integers(0, int(end / q) + 1, size=rng.integers(0, 6))})
    t0 = float(draw(st.sampled_from([0.0, 0.5, 1.25, 3.0])))
    stop = max(end, t0)
    # the rows the run has made by the stop: returns after it never came
    kept = [(r, n) for r, (_, _, n) in zip(returns, launches) if r <= stop]
    return positions, launches, kept, [c for c in cut if 0 < c < stop] + [stop], t0


def _fold_at(positions, launches, returns, cuts, t0) -> Occupancy:
    rec, tally = Recorder(1), StepTally(1, positions)
    given_l = given_r = 0
    for i, c in enumerate(cuts):
        final = i == len(cuts) - 1
        while given_l < len(launches) and (launches[given_l][0] < c or final):
            t, s, n = launches[given_l]
            rec.batches.append(Batch(t, s, n, "decode"))
            given_l += 1
        while given_r < len(returns) and (returns[given_r][0] < c or final):
            rec.tokens.append(TokenReturn(*returns[given_r]))
            given_r += 1
        fold(rec, tally, c, t0 if t0 < c or final else None, final=final)
    return tally.occupancy


@settings(max_examples=200, deadline=None)
@given(schedules())
def test_random_schedules_keep_the_invariants(case):
    """Folded at random cuts or in one pass, the same figures; empty shares in [0, 1]
    and non-decreasing by position, mean requests non-increasing; the seconds by count
    in flight add up to the window; and the positions' request-seconds add up to each
    batch's requests times its time in flight inside the window (worked per batch, no
    sorting)."""
    positions, launches, returns, cuts, t0 = case
    stop = cuts[-1]
    span = stop - t0
    one = _fold_at(positions, launches, returns, [stop], t0)
    cut = _fold_at(positions, launches, returns, cuts, t0)
    assert cut.requests_s == pytest.approx(one.requests_s, abs=1e-9)
    assert cut.count_s == pytest.approx(one.count_s, abs=1e-9)
    if span <= 0:
        return
    means, empty = one.means(span), one.empty_shares(span)
    assert all(0.0 <= e <= 1.0 for e in empty)
    assert all(a <= b + 1e-12 for a, b in zip(empty, empty[1:]))
    assert all(a >= b - 1e-9 for a, b in zip(means, means[1:]))
    assert sum(one.count_s) == pytest.approx(span, abs=1e-9)
    back = [r for r, _ in returns] + [stop] * (len(launches) - len(returns))
    by_batch = sum(n * max(0.0, min(r, stop) - max(t, t0)) for (t, _, n), r in zip(launches, back))
    assert sum(one.requests_s) == pytest.approx(by_batch, abs=1e-9)
    # a position holds a batch whenever it is not empty, so its mean is at least its busy share
    assert all(m >= (1 - e) - 1e-9 for m, e in zip(means, empty))


# ---- what the splits show ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tp2pp4_c64():
    """`pipesim predict --tp 2 --pp 4 --conc 64` (the default profile), its rows kept."""
    return simulate(pipesim.build_scenario(tp=2, pp=4, concurrency=64), record="full")


def test_tp2_pp4_at_c64_positions_show_what_the_labels_hide(tp2pp4_c64):
    """64 requests, four slots: each slot label holds 16 requests on average, but at a
    given moment the slots are unequal (requests reach the scheduler one at a time
    through the front end and stay in the slot that prefilled them): the positions,
    fullest first, read that; their means add up to the requests in flight, at most the
    running cap of 64."""
    rec, r = tp2pp4_c64
    labels, means, empty = r.decode_batch_per_slot, r.occupancy_by_position, r.empty_share_by_position
    assert labels == pytest.approx([labels[0]] * 4)  # every label the same on average
    assert list(means) == sorted(means, reverse=True) and list(empty) == sorted(empty)
    assert means[0] > 1.5 * means[-1]  # the fullest slot holds far more than the emptiest
    assert sum(means) <= 64 + 1e-9
    # checked against the rows: at every step the sizes, fullest first, sum to at most 64
    for _, sizes in occupancy_steps(rec.batches, rec.tokens, 4):
        assert list(sizes) == sorted(sizes, reverse=True) and sum(sizes) <= 64


def test_returns_pair_with_launches_in_order(tp2pp4_c64):
    """The pairing occupancy.py relies on: the i-th token return is the i-th batch's
    (a decode batch returns one token per request, a prefill one per prompt it finished)."""
    rec, _ = tp2pp4_c64
    assert len(rec.tokens) <= len(rec.batches)
    for b, t in zip(rec.batches, rec.tokens):
        assert t.time_s > b.launch_s
        assert t.tokens == b.requests if b.kind == "decode" else t.tokens <= b.requests


@pytest.mark.parametrize(
    "kw",
    [
        dict(tp=1, pp=8, concurrency=16, pp_async_batch_depth=2, output_len="8:40"),
        dict(tp=2, pp=4, concurrency=16, engine="vllm", model="llama-3.1-8b", output_len="8:60"),
    ],
    ids=["SGLang PP8 depth 2", "vLLM PP4"],
)
def test_returns_pair_with_launches_in_order_elsewhere(kw):
    if kw.get("engine") == "vllm":
        kw = {**kw, "profile": "rtx-pro-6000-vllm"}
    rec, r = simulate(pipesim.build_scenario(**kw), record="full")
    for b, t in zip(rec.batches, rec.tokens):
        assert t.time_s >= b.launch_s
        assert t.tokens == b.requests if b.kind == "decode" else t.tokens <= b.requests
    assert len(r.occupancy_by_position) == (10 if "pp_async_batch_depth" in kw else 4)


def test_tp8_one_position_is_the_batch_in_flight():
    """One slot, no overlap scheduler: the position's mean is each batch's requests
    times its time in flight, over the window (worked per batch from the rows). With
    prompts of 16 tokens the batches are the 16 decoding requests but for short
    prefills, and the slot is empty only while the engine loop's CPU works between a
    return and the next launch: the mean lies between 16 x (1 - empty share) and 16."""
    rec, r = simulate(
        pipesim.build_scenario(
            tp=8, concurrency=16, input_len=16, output_len=300, disable_overlap_schedule=True
        ),
        record="full",
    )
    t0, t1 = r.window_s
    by_batch = sum(
        b.requests * max(0.0, min(t.time_s, t1) - max(b.launch_s, t0))
        for b, t in zip(rec.batches, rec.tokens)
    )
    (mean,), (empty,) = r.occupancy_by_position, r.empty_share_by_position
    assert mean == pytest.approx(by_batch / (t1 - t0), rel=1e-9)
    assert r.mean_decode_batch == 16.0
    assert 0.0 < empty < 0.1
    assert 16.0 * (1 - empty) * 0.99 <= mean <= 16.0


def test_the_overlap_scheduler_holds_two_batches_in_flight():
    """SGLang's overlap scheduler (pp = 1, on by default) forms and launches batch n+1
    before batch n's results are back (docs/host-loop.md §3.2): two positions, each
    holding about the 16 requests (the same requests, their last tokens futures)."""
    r = pipesim.predict(tp=8, conc=16, input_len=16, output_len=300)
    first, second = r.occupancy_by_position
    assert 15.0 < second <= first <= 16.0
    assert r.empty_share_by_position[0] < r.empty_share_by_position[1] < 0.1


def test_vllm_positions_agree_with_its_groups_where_they_stay_put():
    """vLLM PP4 with 8 requests arriving at once: one group of 8 stays in flight
    (docs/engines.md §6), launch-sampled (`group_sizes`) or over time alike, the group
    out of flight only while the engine loop's CPU works between its return and its
    next launch."""
    r = pipesim.predict(
        tp=2,
        pp=4,
        conc=8,
        engine="vllm",
        profile="rtx-pro-6000-vllm",
        model="llama-3.1-8b",
        output_len=60,
        intervals=False,
    )
    empty = r.empty_share_by_position[0]
    assert 0.0 < empty < 0.1
    assert 8.0 * (1 - empty) * 0.95 <= r.occupancy_by_position[0] <= 8.0
    assert r.occupancy_by_position[1:] == [0.0, 0.0, 0.0]
    assert r.empty_share_by_position[1:] == pytest.approx([1.0, 1.0, 1.0], abs=1e-12)
    assert r.group_sizes[1:] == [0.0, 0.0, 0.0]


def test_data_parallel_ranks_have_no_positions():
    r = pipesim.predict(
        tp=2, dp=2, dp_attention=True, conc=8, model="qwen3-30b-a3b", output_len=20, intervals=False
    )
    assert r.occupancy_by_position is None and r.empty_share_by_position is None

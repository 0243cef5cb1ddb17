"""scenario/admission.py: how many requests an engine runs at once, worked by hand, and
the run, the work bound and a sweep's columns all taking it from there."""

from dataclasses import dataclass

import pytest

import pipesim
from pipesim.inputs.workload import closed_loop, poisson
from pipesim.scenario.admission import admission
from pipesim.scenario.build import scenario_steps


@dataclass(frozen=True)
class Caps:
    """An engine's settings, only the bounds admission reads."""

    running_cap: int = 64
    slot_cap: int = 0
    slots: int = 1
    kv_tokens: int = 1_000_000


def test_clients_below_every_bound_all_run():
    a = admission(closed_loop(8, "100", "50"), Caps())
    assert (a.admitted, a.cap, a.reason) == (8, 64, "running cap")


def test_the_running_cap_holds_clients_beyond_it_back():
    a = admission(closed_loop(100, "100", "50"), Caps(running_cap=64))
    assert (a.admitted, a.reason) == (64, "running cap")


def test_the_kv_cache_at_mean_and_at_largest_lengths():
    # input 100-300 (mean 200), output 50-150 (mean 100): 300 tokens a request on
    # average, 450 at the largest; a pool of 3,000 tokens holds 10 or 6 of them
    w = closed_loop(32, "100:300", "50:150")
    mean, most = admission(w, Caps(kv_tokens=3000)), admission(w, Caps(kv_tokens=3000), lengths="max")
    assert (mean.request_tokens, mean.kv_requests, mean.admitted, mean.reason) == (300, 10, 10, "KV cache")
    assert (most.request_tokens, most.kv_requests, most.cap, most.reason) == (450, 6, 6, "KV cache")


def test_sglang_slots_bound_the_running_requests():
    # SGLang's default per-slot cap at pp 3 with 64 running: 64 // 3 = 21 a slot, 3 slots
    a = admission(closed_loop(64, "100", "50"), Caps(running_cap=64, slot_cap=21, slots=3))
    assert (a.slot_cap, a.admitted, a.reason) == (63, 63, "per-slot cap x slots")


def test_a_tie_names_the_running_cap():
    a = admission(closed_loop(100, "100", "50"), Caps(running_cap=64, slot_cap=8, slots=8))
    assert (a.cap, a.reason) == (64, "running cap")


def test_dp_ranks_each_bring_their_caps_and_kv_pool():
    # 4 ranks of 16 running and 3,000 KV tokens (20 requests of 150): 64 and 80 in all
    caps = Caps(running_cap=16, kv_tokens=3000)
    a = admission(closed_loop(100, "100", "50"), caps, dp=4)
    assert (a.running_cap, a.kv_requests, a.admitted, a.reason) == (64, 80, 64, "running cap")
    assert admission(closed_loop(50, "100", "50"), caps, dp=4).admitted == 50
    small_kv = admission(closed_loop(100, "100", "50"), Caps(running_cap=16, kv_tokens=1500), dp=4)
    assert (small_kv.admitted, small_kv.reason) == (40, "KV cache")  # 10 a rank


def test_an_open_loop_has_no_clients_only_the_cap():
    a = admission(poisson(1.0, 10, "100", "50"), Caps(running_cap=32))
    assert (a.clients, a.admitted) == (0, 32)


def test_lengths_is_checked():
    with pytest.raises(ValueError, match="lengths must be one of mean, max"):
        admission(closed_loop(8), Caps(), lengths="median")


def _pp2(profile, **kw):
    """Llama 8B on two stages, 63 running: SGLang's per-slot cap is 63 // 2 = 31, two
    slots hold 62."""
    return pipesim.build_scenario(
        tp=1, pp=2, model="llama-3.1-8b", profile=profile, max_running_requests=63, **kw
    )


def test_the_engine_settings_feed_the_slot_bound(profile):
    sc = _pp2(profile, concurrency=64, input_len=64, output_len=40)
    a = admission(sc.workload, sc.settings, sc.plan.dp)
    assert (a.running_cap, a.slot_cap, a.admitted, a.reason) == (63, 62, 62, "per-slot cap x slots")


def test_the_run_and_the_work_bound_take_the_cap_from_admission(profile):
    from pipesim.sim.runner import admitted_concurrency

    sc = _pp2(profile, concurrency=64, input_len=64, output_len=40)
    assert admitted_concurrency(sc) == 62
    # warm-up 64 + the least measured 128, 40 tokens each, 62 a batch (build.workload_steps)
    steps, how = scenario_steps(sc)
    assert steps == pytest.approx((64 + 128) * 40 / 62)
    assert how.endswith("/ batch 62")


def test_a_sweep_row_carries_the_bounds_of_its_scenario(profile):
    from pipesim.explore.sweep import sweep

    row = sweep(
        splits=[(1, 2)],
        conc=[64],
        model="llama-3.1-8b",
        profile=profile,
        max_running_requests=63,
        input_len=64,
        output_len=8,
        workers=1,
    ).iloc[0]
    assert (row.running_cap, row.slot_cap, row.slots) == (63, 31, 2)
    assert (row.effective_cap, row.cap_reason) == (62, "per-slot cap x slots")
    assert row.kv_request_cap == row.kv_cache_tokens // (64 + 8)

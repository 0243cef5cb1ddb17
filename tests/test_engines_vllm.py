"""vLLM V1's batch queue (physics.md §6): batches in flight, implicit groups,
max_num_seqs caps the total, chunked prefill mixed with decode."""

from collections import defaultdict

import pytest
from conftest import no_host_loop, simulate

import pipesim
from pipesim.profiles.profile import load_profile


def load_profile_vllm():
    return load_profile("rtx-pro-6000-vllm")


def scenario(profile, pp, **kw):
    kw.setdefault("concurrency", 8)
    return pipesim.build_scenario(tp=1, pp=pp, model="llama-3.1-8b", engine="vllm", profile=profile, **kw)


@pytest.mark.parametrize("pp", [1, 2, 4, 8])
def test_batches_in_flight_is_pp(vllm_profile, pp):
    # without async scheduling (vllm/config/vllm.py max_concurrent_batches)
    assert scenario(vllm_profile, pp, async_scheduling=False).settings.max_concurrent_batches == pp


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_async_scheduling_adds_one(vllm_profile, pp):
    assert scenario(vllm_profile, pp, async_scheduling=True).settings.max_concurrent_batches == pp + 1


def test_defaults_on_big_gpus(vllm_profile):
    # vllm serve defaults on GPUs with >= 70 GiB: max_num_seqs 1024, 8192 batched tokens, 0.9 memory
    st = scenario(vllm_profile, 2).settings
    assert (st.max_num_seqs, st.max_num_batched_tokens, st.gpu_memory_utilization) == (1024, 8192, 0.9)


def run_tracked(sc, warm, measure):
    """Track in-flight batches (launch -> return) and what was in them."""
    events = {
        "violations": [],
        "peak_batches": 0,
        "peak_running": 0,
        "mixed": 0,
        "launches": 0,
        "groups": defaultdict(set),
    }
    inflight = {}  # micro-batch seq -> decode request ids

    def setup(sim):
        eng = sim.instances[0]  # the engine instance its scheduler drives
        sched = eng.scheduler
        orig_launch, orig_complete = eng.launch, sim.complete

        def launch(slot, decode, prefill):
            # without async scheduling a decode request is in one batch in flight; with it
            # (AsyncScheduler, placeholders) in at most two
            copies = defaultdict(int)
            for ids in inflight.values():
                for rid in ids:
                    copies[rid] += 1
            limit = 2 if sc.settings.async_scheduling else 1
            for r in decode:
                if copies[r.rid] >= limit:
                    events["violations"].append(("decode in too many batches in flight", r.rid, sim.env.now))
            if len(decode) != len({r.rid for r in decode}):
                events["violations"].append(("duplicate in batch", sim.env.now))
            if decode and prefill:
                events["mixed"] += 1
            mb = orig_launch(slot, decode, prefill)
            inflight[mb.seq] = {r.rid for r in decode}
            events["launches"] += 1
            events["peak_batches"] = max(events["peak_batches"], len(inflight))
            events["peak_running"] = max(events["peak_running"], eng.running, len(sched.active))
            return mb

        def complete(mb):
            inflight.pop(mb.seq)
            return orig_complete(mb)

        eng.launch, sim.complete = launch, complete

    sim = simulate(sc, warm, measure, setup)
    return sim, events


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_queue_invariants_under_pressure(vllm_profile, async_scheduling):
    # more clients than max_num_seqs; a small token budget spreads prompts over several
    # batches (chunks advance at schedule time), so several batches are in flight and
    # decode requests split into several implicit groups
    sc = scenario(
        vllm_profile,
        4,
        concurrency=24,
        max_num_seqs=12,
        max_num_batched_tokens=48,
        input_len="64:256",
        output_len="3:40",
        async_scheduling=async_scheduling,
        seed=5,
    )
    sim, ev = run_tracked(sc, 24, 60)
    st = sc.settings
    assert sim.completed >= 84
    # a decode request is in no more in-flight batches than the engine allows
    assert not ev["violations"]
    # no more batches in flight than the engine allows; several were
    assert 2 <= ev["peak_batches"] <= st.max_concurrent_batches
    # max_num_seqs caps the total running requests, and binds here
    assert ev["peak_running"] == st.max_num_seqs == 12


def test_chunked_prefill_mixed_and_conserved(vllm_profile):
    # physics.md §6: chunked prefill is mixed with decode in one batch under a token budget
    sc = scenario(
        vllm_profile,
        2,
        concurrency=6,
        input_len="100:300",
        output_len="5:30",
        max_num_batched_tokens=64,
        seed=2,
    )
    chunks = defaultdict(list)
    budget_ok = []

    def setup(sim):
        eng = sim.instances[0]  # the engine instance its scheduler drives
        orig = eng.launch

        def launch(slot, decode, prefill):
            budget_ok.append(len(decode) + sum(c for _, c, _ in prefill) <= 64)
            for r, c, p in prefill:
                chunks[r.rid].append((p, c))
            return orig(slot, decode, prefill)

        eng.launch = launch

    sim = simulate(sc, 6, 12, setup)
    assert sim.completed >= 18
    assert all(budget_ok)
    assert any(kind == "mixed" for *_, kind in sim.record().batches)
    # each prompt token is prefilled exactly once, chunks in order
    for rid, parts in chunks.items():
        pos = 0
        for p, c in parts:
            assert p == pos
            pos += c
        assert pos <= sim.requests[rid].input_len
        if sim.requests[rid].finish_s >= 0:
            assert pos == sim.requests[rid].input_len


def test_one_group_when_all_start_together(vllm_profile):
    # implicit groups: C requests that arrive at once are all scheduled in the first
    # batch and stay together, so with PP4 only one batch of decodes is ever in flight
    # at a time (the 1/pp utilisation pathology, physics.md §6)
    sc = scenario(no_host_loop(vllm_profile), 4, concurrency=8, output_len="20")  # no front end: at once
    sim, ev = run_tracked(sc, 0, 8)
    decode_batches = [b for b in sim.record().batches if b[3] == "decode"]
    assert decode_batches
    assert all(size == 8 for _, _, size, _ in decode_batches)
    # the stages are mostly idle: each stage is busy ~1/pp of the time at most
    busy = sum(e - s for s, e in sim.record().compute[0])
    assert busy / sim.env.now < 0.5


def test_group_sizes_show_the_single_group():
    # the result's in-flight groups (the analogue of decode_batch_per_slot): C = 8
    # arriving at once form one group, so with PP4 one batch of 8 is in flight and the
    # other three places are empty
    sc = scenario(no_host_loop(load_profile_vllm()), 4, concurrency=8, output_len="20")
    r = pipesim.run(sc, warmup_requests=8, measure_requests=16, ci_target=None)
    assert len(r.group_sizes) == 4
    assert r.group_sizes[0] == pytest.approx(8) and r.group_sizes[1:] == [0.0, 0.0, 0.0]

"""SGLang's PP scheduling rules (physics.md §6): per-slot cap, slots, sticky slots,
prefill-first, prefill and decode never mixed, chunked prefill."""

from collections import defaultdict

import pytest
from conftest import record_launches, simulate

import pipesim
from pipesim.engines.sglang import SGLangConfig

# ---- resolved knobs ---------------------------------------------------------------------


def test_per_slot_cap_is_mrr_over_pp(profile):
    # physics.md §1, §6: --max-running-requests 64 --pp-size 8 gives 64 // 8 = 8 per slot
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=64, max_running_requests=64, profile=profile)
    assert sc.settings.max_running_requests == 64
    assert sc.settings.pp_max_micro_batch_size == 8
    assert sc.settings.slots == 8


def test_explicit_cap_wins(profile):
    # the deployment's fix: --pp-max-micro-batch-size 64
    sc = pipesim.build_scenario(
        tp=1, pp=8, concurrency=64, max_running_requests=64, pp_max_micro_batch_size=64, profile=profile
    )
    assert sc.settings.pp_max_micro_batch_size == 64


@pytest.mark.parametrize("tp,pp", [(1, 8), (2, 4), (4, 2), (8, 1)])
def test_default_cap_follows_rule(profile, tp, pp):
    sc = pipesim.build_scenario(tp=tp, pp=pp, concurrency=4, profile=profile)
    st = sc.settings
    assert st.pp_max_micro_batch_size == max(st.max_running_requests // pp, 1)
    assert 1 <= st.max_running_requests <= sc.memory.kv_tokens


def test_tiny_mrr_cap_at_least_one(profile):
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=4, max_running_requests=3, profile=profile)
    assert sc.settings.pp_max_micro_batch_size == 1


@pytest.mark.parametrize("pp,depth,slots", [(2, 0, 2), (4, 0, 4), (4, 3, 7), (8, 0, 8), (8, 8, 16)])
def test_slots_are_pp_plus_async_depth(profile, pp, depth, slots):
    # physics.md §6: pp_loop_size = pp_size + pp_async_batch_depth (16 slots on PP8 = depth 8)
    sc = pipesim.build_scenario(
        tp=1, pp=pp, concurrency=4, pp_async_batch_depth=depth, model="llama-3.1-8b", profile=profile
    )
    assert sc.settings.slots == slots
    assert sc.settings.pp_async_batch_depth == depth


def test_default_async_depth_is_zero():
    assert SGLangConfig().pp_async_batch_depth == 0


def test_chunk_size_default_by_memory(profile):
    # SGLang: 8192-token chunks on GPUs of 60-160 GB (README: "chunked prefill 8192")
    sc = pipesim.build_scenario(tp=2, pp=4, concurrency=4, profile=profile)
    assert sc.settings.chunked_prefill_size == 8192


# ---- the scheduler in a simulation ----------------------------------------------------------


def run_checked(scenario, warm, measure):
    """Run a simulation recording every launch and every turn that formed a decode
    batch, with whether a request that could have been admitted was waiting."""
    turns = []
    launches = []

    def setup(sim):
        eng = sim.instances[0]  # the engine instance its scheduler drives
        sched = eng.scheduler
        st = sched.s
        log = record_launches(sim)
        launches.append(log)
        orig_launch = eng.launch

        def launch(slot, decode, prefill):
            # state the engine launched from: the slot's running requests, total running
            launch.snap.append((slot, len(sched.slot_running[slot]), eng.running, len(decode), len(prefill)))
            return orig_launch(slot, decode, prefill)

        launch.snap = []
        eng.launch = launch
        launches.append(launch.snap)
        orig_form = sched.form

        def form(slot):
            head = eng.waiting[0] if eng.waiting else None
            admissible = getattr(sched, "chunked", None) is not None or (
                head is not None
                and eng.running < st.max_running_requests
                and eng.kv_free >= head.input_len + head.output_len
                and len(sched.slot_running[slot]) < st.pp_max_micro_batch_size
            )
            out = orig_form(slot)
            if out is not None and out[0]:
                turns.append((slot, admissible, bool(eng.waiting)))
            return out

        sched.form = form

    sim = simulate(scenario, warm, measure, setup)
    log, snaps = launches
    return sim, log, snaps, turns


def check_rules(sim, log, snaps, turns):
    st = sim.settings
    cap, mrr = st.pp_max_micro_batch_size, st.max_running_requests
    assert log, "nothing launched"
    prefill_slot = {}
    decode_slots = defaultdict(set)
    for _, slot, decode, prefill, _mb in log:
        # prefill and decode never mixed under PP
        assert not (decode and prefill)
        # no decode micro-batch exceeds the per-slot cap
        assert len(decode) <= cap
        for r, chunk, prefix in prefill:
            if prefix + chunk == r.input_len:
                prefill_slot[r.rid] = slot
        for r in decode:
            decode_slots[r.rid].add(slot)
    assert all(kind != "mixed" for *_, kind in sim.record().batches)
    # sticky: every request decodes in one slot only, the slot that prefilled it
    assert decode_slots
    for rid, slots in decode_slots.items():
        assert slots == {prefill_slot[rid]}, f"request {rid} decoded in slots {slots}"
        assert sim.requests[rid].slot == prefill_slot[rid]
    # admission respects the slot cap and max_running_requests (no chunking here)
    for _slot, in_slot, running, _n_decode, n_prefill in snaps:
        assert in_slot + n_prefill <= cap
        assert running <= mrr
    # prefill-first: a turn that formed a decode batch had nobody admissible waiting
    assert turns
    assert not [t for t in turns if t[1]], "a decode batch ran while an admissible request waited"
    return decode_slots


def test_kimi_pp8_lockstep_cap(profile):
    # the reference deployment's pathology: C=64, mrr 64, PP8 -> 8 requests per slot
    sc = pipesim.build_scenario(
        tp=1, pp=8, concurrency=64, max_running_requests=64, output_len="12", profile=profile
    )
    sim, log, snaps, turns = run_checked(sc, 64, 64)
    check_rules(sim, log, snaps, turns)
    sizes = [len(d) for _, _, d, _, _ in log if d]
    assert max(sizes) == 8  # the cap is reached (and never exceeded, checked above)


@pytest.mark.parametrize("depth", [0, 2])
def test_llama_pp4_rules_under_pressure(profile, depth):
    # more clients than max_running_requests, varied lengths: requests wait, slots fill
    # and drain at different times
    sc = pipesim.build_scenario(
        tp=1,
        pp=4,
        concurrency=24,
        max_running_requests=16,
        model="llama-3.1-8b",
        input_len="64:256",
        output_len="3:40",
        pp_async_batch_depth=depth,
        seed=3,
        profile=profile,
    )
    assert sc.settings.pp_max_micro_batch_size == 4
    sim, log, snaps, turns = run_checked(sc, 24, 60)
    check_rules(sim, log, snaps, turns)
    # the prefill-first check was not vacuous: decode turns happened with requests waiting
    assert any(waiting for _, _, waiting in turns)
    # more than one slot was used
    assert len({slot for _, slot, d, _, _ in log if d}) > 1


@pytest.mark.parametrize("overlap", [False, True])
def test_pp1_runs_one_batch_at_a_time_or_two_with_the_overlap_scheduler(profile, overlap):
    """Without the overlap scheduler one batch at a time; with it (the default from
    0.3.6) the next batch is launched before the last one's results are in: two."""
    sc = pipesim.build_scenario(
        tp=2,
        pp=1,
        concurrency=8,
        model="llama-3.1-8b",
        output_len="10",
        profile=profile,
        disable_overlap_schedule=None if overlap else True,
    )
    assert sc.settings.slots == 1 and sc.settings.host.overlap is overlap
    inflight = []
    peak = [0]

    def setup(sim):
        eng = sim.instances[0]  # the engine instance its scheduler drives
        orig_launch, orig_complete = eng.launch, sim.complete

        def launch(slot, decode, prefill):
            inflight.append(1)
            peak[0] = max(peak[0], len(inflight))
            return orig_launch(slot, decode, prefill)

        def complete(mb):
            inflight.pop()
            return orig_complete(mb)

        eng.launch, sim.complete = launch, complete

    sim = simulate(sc, 8, 8, setup)
    assert sim.completed >= 16
    assert peak[0] == (2 if overlap else 1)


# ---- chunked prefill ---------------------------------------------------------------------


def chunk_run(profile, pp):
    sc = pipesim.build_scenario(
        tp=1,
        pp=pp,
        concurrency=2,
        model="llama-3.1-8b",
        input_len="300",
        output_len="10",
        chunked_prefill_size=128,
        profile=profile,
    )
    sim = None
    logs = []

    def setup(s):
        logs.append(record_launches(s))

    sim = simulate(sc, 2, 4, setup)
    return sim, logs[0]


def check_chunks(sim, log):
    chunks = defaultdict(list)
    for _, _, _, prefill, _ in log:
        for r, chunk, prefix in prefill:
            chunks[r.rid].append((prefix, chunk))
    assert chunks
    for rid, parts in chunks.items():
        r = sim.requests[rid]
        # each prompt token is prefilled once: chunks tile [0, input_len) in order
        pos = 0
        for prefix, chunk in parts:
            assert prefix == pos, f"request {rid}: chunk at {prefix}, expected {pos} ({parts})"
            pos += chunk
        assert pos <= r.input_len
        assert r.prefilled <= r.input_len
    # the run finished what it was asked to
    assert sim.completed >= 6


def test_chunked_prefill_pp1(profile):
    sim, log = chunk_run(profile, 1)
    check_chunks(sim, log)


def test_chunked_prefill_pp4(profile):
    sim, log = chunk_run(profile, 4)
    check_chunks(sim, log)


# ---- SGLangScheduler.form on a hand-built state ----------------------------------------------


class FakeSim:
    """The few things the scheduler reads and calls on a Simulation (EngineSimulation)."""

    def __init__(self, kv_tokens=100_000):
        from collections import deque

        self.waiting = deque()
        self.running = 0
        self.kv_free = kv_tokens
        self.cpu_iteration_s = 0.0
        self.host = None  # the host loop's costs: `form` reads none

    def admit(self, r):
        r.kv_reserved = r.input_len + r.output_len
        self.kv_free -= r.kv_reserved
        self.running += 1


def make_scheduler(mrr=16, cap=4, slots=4, chunk=8192, kv=100_000):
    from pipesim.engines.sglang_loop import SGLangScheduler, SGLangSettings

    st = SGLangSettings(
        max_running_requests=mrr,
        pp_max_micro_batch_size=cap,
        pp_async_batch_depth=0,
        slots=slots,
        chunked_prefill_size=chunk,
        max_prefill_tokens=16384,
        kv_tokens=kv,
        mem_fraction_static=0.9,
        cuda_graph_max_bs=256,
    )
    sim = FakeSim(kv)
    return SGLangScheduler(sim, st), sim


def req(rid, n_in=256, n_out=100):
    from pipesim.engines.batches import Request

    return Request(rid, 0.0, n_in, n_out)


def seat(sched, sim, slot, n):
    """n requests already decoding in `slot`."""
    for i in range(n):
        r = req(1000 + slot * 100 + i)
        sim.admit(r)
        r.prefilled, r.generated, r.slot = r.input_len, 1, slot
        sched.slot_running[slot].append(r)


def test_form_prefill_first():
    sched, sim = make_scheduler()
    seat(sched, sim, 1, 2)
    w = req(1)
    sim.waiting.append(w)
    decode, prefill = sched.form(1)
    assert decode == [] and prefill == [(w, 256, 0)]  # prefill instead of the decode batch
    assert not sim.waiting and sim.running == 3


def test_form_decodes_when_slot_full():
    sched, sim = make_scheduler(cap=2)
    seat(sched, sim, 0, 2)
    sim.waiting.append(req(1))
    decode, prefill = sched.form(0)
    assert prefill == [] and decode == sched.slot_running[0]
    assert len(sim.waiting) == 1
    # another slot with room takes it
    decode, prefill = sched.form(1)
    assert decode == [] and len(prefill) == 1


def test_form_decodes_at_max_running_requests():
    sched, sim = make_scheduler(mrr=2, cap=4)
    seat(sched, sim, 0, 1)
    seat(sched, sim, 1, 1)
    sim.waiting.append(req(1))
    decode, prefill = sched.form(0)
    assert prefill == [] and len(decode) == 1 and len(sim.waiting) == 1


def test_form_decodes_when_kv_short():
    sched, sim = make_scheduler(kv=500)
    seat(sched, sim, 0, 1)  # 356 tokens reserved, 144 free
    sim.waiting.append(req(1))  # needs 356
    decode, prefill = sched.form(0)
    assert prefill == [] and len(decode) == 1


def test_form_prefill_fills_only_to_cap():
    sched, sim = make_scheduler(cap=4)
    seat(sched, sim, 2, 1)
    for i in range(6):
        sim.waiting.append(req(i))
    decode, prefill = sched.form(2)
    assert decode == [] and len(prefill) == 3  # 1 running + 3 new = cap 4
    assert len(sim.waiting) == 3


def test_form_idle_slot():
    sched, sim = make_scheduler()
    assert sched.form(0) is None


def test_form_chunks_long_prompt():
    sched, sim = make_scheduler(chunk=8192)
    w = req(1, n_in=20000)
    sim.waiting.append(w)
    decode, prefill = sched.form(0)
    assert prefill == [(w, 8192, 0)]
    assert sched.chunked is w  # the rest continues in the next turns

"""KV admission and eviction as the engines do it (docs/engines.md §4; SGLang read at
00ff98d3: schedule_policy.py `PrefillAdder`, scheduler.py `update_running_batch`,
schedule_batch.py `retract_decode`; vLLM at 000fc94b: vllm/v1/core/sched/scheduler.py
`Scheduler.schedule`, `_preempt_request`, kv_cache_manager.py `allocate_slots`)."""

from collections import deque

import pytest
from conftest import simulate, small_kv_scenario

import pipesim
from pipesim.engines import kv
from pipesim.engines.batches import Request
from pipesim.engines.sglang_loop import SGLangScheduler, SGLangSettings
from pipesim.engines.vllm_loop import VLLMScheduler, VLLMSettings


class FakeSim:
    """The part of the Simulation a scheduler's `form` uses, with a hand-set pool."""

    def __init__(self, kv_free: int, pp: int = 1):
        self.waiting: deque = deque()
        self.kv_free, self.running, self.pp = kv_free, 0, pp
        self.cpu_iteration_s = 0.0
        self.host = None  # the host loop's costs: `form` reads none
        self.requeued: list = []

    def admit(self, req: Request) -> None:
        req.queued = None
        req.prefilled = req.scheduled = 0
        req.prefill_len = req.input_len + req.generated
        self.running += 1

    def requeue(self, req: Request, front: bool) -> None:
        self.kv_free += req.kv_reserved
        req.kv_reserved, req.queued = 0, self.waiting
        req.evicted += 1
        self.running -= 1
        self.requeued.append(req)
        (self.waiting.appendleft if front else self.waiting.append)(req)


def decoding(rid: int, input_len: int, generated: int, output_len: int, held: int) -> Request:
    """A request past its prefill, holding `held` KV tokens."""
    r = Request(rid, 0.0, input_len, output_len)
    r.prefilled = r.scheduled = input_len
    r.generated, r.kv_reserved = generated, held
    return r


def sglang(kv_free: int, cap: int = 64) -> tuple[FakeSim, SGLangScheduler]:
    st = SGLangSettings(
        max_running_requests=256,
        pp_max_micro_batch_size=cap,
        pp_async_batch_depth=0,
        slots=1,
        chunked_prefill_size=8192,
        max_prefill_tokens=16384,
        kv_tokens=10**6,
        mem_fraction_static=0.9,
        cuda_graph_max_bs=0,
    )
    sim = FakeSim(kv_free)
    return sim, SGLangScheduler(sim, st)


# ---- SGLang: new_token_ratio ---------------------------------------------------------------


def test_new_token_ratio_starts_decays_and_floors():
    # Scheduler.init_new_token_ratio: init 0.7 x conservativeness 1.0, floor 0.7 x 0.14,
    # decay (init - floor) / 600 per decode step without retraction
    t = kv.NewTokenRatio()
    assert t.value == pytest.approx(0.7)
    assert t.floor == pytest.approx(0.098)
    for _ in range(300):
        t.step()
    assert t.value == pytest.approx((0.7 + 0.098) / 2)
    for _ in range(300):
        t.step()
    assert t.value == pytest.approx(0.098)
    for _ in range(50):
        t.step()
    assert t.value == pytest.approx(0.098)  # never below the floor
    t.reset()
    assert t.value == pytest.approx(0.7)  # an idle server starts again from init


def test_conservativeness_scales_and_caps_init():
    assert kv.NewTokenRatio(2.0).value == 1.0  # min(0.7 x 2, 1)
    assert kv.NewTokenRatio(0.5).floor == pytest.approx(0.35 * 0.14)


def test_retract_estimate_formula():
    # retract_decode: (decoded + 20 x kept) / (sum max_new_tokens + 1), at most 1
    kept = [decoding(0, 10, 30, 100, 0), decoding(1, 10, 50, 200, 0)]
    assert kv.retract_estimate(kept) == pytest.approx((80 + 40) / 301)
    assert kv.retract_estimate([decoding(2, 10, 95, 100, 0)]) == 1.0


# ---- SGLang: PrefillAdder -------------------------------------------------------------------


@pytest.mark.parametrize("extra,admitted", [(0, False), (1, True)])
def test_prefill_adder_reserves_for_the_slot_by_ratio(extra, admitted):
    # add_one_req: input + min(max_new, 4096) + page(1) must be < rem_total_tokens =
    # free - sum over the slot's running of min(max_new - generated, 4096) x ratio
    running = [decoding(0, 100, 20, 220, 120), decoding(1, 100, 50, 150, 150)]
    offset = (200 + 100) * 0.7
    need = 300 + 200 + 1
    sim, sched = sglang(int(need + offset) + extra)
    sched.slot_running[0] = running
    sim.waiting.append(Request(7, 0.0, 300, 200))
    chunks = sched._prefill(0)
    assert bool(chunks) is admitted
    if admitted:
        assert chunks[0][1] == 300 and sim.kv_free == int(need + offset) + extra - 300


def test_prefill_adder_clips_the_output_estimate():
    # CLIP_MAX_NEW_TOKENS = 4096: a 100k-token max_new reserves 4096
    sim, sched = sglang(100 + 4096 + 2)
    sim.waiting.append(Request(0, 0.0, 100, 100_000))
    assert sched._prefill(0)


def test_prefill_adder_counts_requests_admitted_in_the_same_pass():
    # each admitted request's input and max_new come off the budget for the next one
    sim, sched = sglang(2 * (100 + 50) + 1)
    for i in range(3):
        sim.waiting.append(Request(i, 0.0, 100, 50))
    chunks = sched._prefill(0)
    # the first fits (151 < 301); the second needs 151 < 301 - 100 (taken) - 50 (reserved) = 151: no
    assert [c[0].rid for c in chunks] == [0]


# ---- SGLang: retract_decode -----------------------------------------------------------------


def test_retract_decode_order_count_and_requeue():
    # sort by (outputs, -prompt) descending, evict from the end until the rest can decode
    # one token each; at least one; evicted go to the back of the waiting queue
    gens, prompts = [5, 1, 3, 1, 2], [10, 10, 10, 20, 10]
    running = [decoding(i, p, g, 100, 1) for i, (g, p) in enumerate(zip(gens, prompts))]
    sim, sched = sglang(1)
    sim.waiting.append(Request(9, 0.0, 10, 10))
    sched.slot_running[0] = running
    sched.retract(running)
    # free 1 -> evict (1 output, prompt 20): free 2 < 4 -> evict (1, 10): free 3 >= 3, stop
    assert [r.rid for r in sim.requeued] == [3, 1]
    assert [r.rid for r in running] == [0, 2, 4]
    assert [r.rid for r in sim.waiting] == [9, 3, 1]
    assert sched.ratio.value == pytest.approx((5 + 3 + 2 + 20 * 3) / (300 + 1))


def test_retract_decode_evicts_at_least_one_never_the_last():
    running = [decoding(i, 10, 5, 100, 1) for i in range(3)]
    sim, sched = sglang(100)  # room for all: still one goes (first_iter)
    sched.retract(running)
    assert len(sim.requeued) == 1 and len(running) == 2
    alone = [decoding(5, 10, 5, 100, 1)]
    sim, sched = sglang(0)
    sched.retract(alone)
    assert not sim.requeued and len(alone) == 1


def test_decode_without_memory_retracts_and_takes_one_token_each():
    # check_decode_mem: 4 requests need 4 tokens, 2 free -> retract the fewest-output one
    # (frees its 11), then the 3 kept take one token each
    running = [decoding(i, 10, i + 1, 100, 11) for i in range(4)]
    sim, sched = sglang(2)
    sched.slot_running[0] = running
    decode, prefill = sched.form(0)
    assert [r.rid for r in sim.requeued] == [0] and not prefill
    assert [r.rid for r in decode] == [1, 2, 3]
    assert sim.kv_free == 2 + 11 - 3 and all(r.kv_reserved == 12 for r in decode)


# ---- vLLM: blocks and recompute preemption -------------------------------------------------


@pytest.mark.parametrize("tokens,blocks", [(1, 1), (16, 1), (17, 2), (256, 16), (257, 17)])
def test_vllm_blocks_are_ceil_over_16(tokens, blocks):
    # allocate_slots: cdiv(num_computed_tokens + num_new_tokens, block_size), block_size 16
    assert kv.blocks_for(tokens) == blocks


def vllm(kv_free: int, seqs: int = 64) -> tuple[FakeSim, VLLMScheduler]:
    st = VLLMSettings(seqs, 8192, False, 1, 10**6, 0.9, 0)
    sim = FakeSim(kv_free)
    return sim, VLLMScheduler(sim, st)


def running_vllm(sched: VLLMScheduler, rid: int, computed: int, output_len: int = 100) -> Request:
    """A decoding request whose last token's KV lands at position `computed`."""
    r = decoding(rid, computed - 1, 1, output_len, kv.blocks_for(computed - 1) * 16)
    sched.computed[rid] = computed - 1
    sched.active.append(r)
    return r


def test_vllm_admission_takes_whole_blocks_and_reserves_nothing_ahead():
    sim, sched = vllm(64)
    sim.waiting.append(Request(0, 0.0, 40, 5000))  # 3 blocks; its 5000 outputs reserve nothing
    sim.waiting.append(Request(1, 0.0, 20, 10))  # 2 blocks: 48 + 32 > 64, stops admission
    _, prefill = sched.form()
    assert [(r.rid, n) for r, n, _ in prefill] == [(0, 40)]
    assert prefill[0][0].kv_reserved == 48 and sim.kv_free == 16


def test_vllm_preempts_the_last_running_to_the_queue_front():
    sim, sched = vllm(0)
    a = running_vllm(sched, 0, 33)  # its next token needs a third block
    b = running_vllm(sched, 1, 20)
    c = running_vllm(sched, 2, 30)  # latest admitted: preempted first
    sim.waiting.append(Request(9, 0.0, 10, 10))
    decode, prefill = sched.form()
    assert sim.requeued == [c] and [r.rid for r in sim.waiting] == [2, 9]
    assert c.kv_reserved == 0 and 2 not in sched.computed
    assert decode == [a, b] and a.kv_reserved == 48
    assert not prefill  # after a preemption no waiting request is admitted in that step


def test_vllm_request_that_preempts_itself_is_not_scheduled():
    sim, sched = vllm(0)
    a = running_vllm(sched, 0, 17)  # needs a second block; nobody else to preempt
    assert sched.form() is None
    assert sim.requeued == [a] and sim.waiting[0] is a and sim.kv_free == 16


# ---- in a simulation: tight KV evicts, ample KV never does, every request completes ---------


def open_loop_done(sim, n: int) -> None:
    assert sim.completed == n
    assert all(r.finish_s > 0 and r.generated == r.output_len for r in sim.requests)
    assert sim.instances[0].kv_free == sim.settings.kv_tokens  # every token given back


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_tight_kv_evicts_and_every_request_completes(engine):
    sc = small_kv_scenario(
        engine, 1500, rate_rps=500.0, num_requests=30, input_len="100:200", output_len="100:300"
    )
    sim = simulate(sc, 0, 30)
    open_loop_done(sim, 30)
    evicted = [r for r in sim.requests if r.evicted]
    assert len(sim.rec.evictions) == sum(r.evicted for r in sim.requests) > 0
    assert evicted and all(r.first_token_s > 0 for r in evicted)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_ample_kv_never_evicts(engine):
    sc = small_kv_scenario(
        engine, 60_000, rate_rps=500.0, num_requests=30, input_len="100:200", output_len="100:300"
    )
    sim = simulate(sc, 0, 30)
    open_loop_done(sim, 30)
    assert not sim.rec.evictions


def test_vllm_blocks_held_follow_computed_tokens():
    # at every launch a decoding request holds ceil(computed / 16) blocks, computed =
    # prompt + outputs (the newest token's KV is written by this step), async off
    sc = small_kv_scenario("vllm", 4000, concurrency=8, output_len="30:60")
    bad = []

    def setup(sim):
        eng = sim.instances[0]
        orig = eng.launch

        def launch(slot, decode, prefill):
            for r in decode:
                if r.kv_reserved != kv.blocks_for(r.input_len + r.generated) * 16:
                    bad.append((r.rid, r.kv_reserved, r.input_len + r.generated))
            return orig(slot, decode, prefill)

        eng.launch = launch

    simulate(sc, 8, 16, setup)
    assert not bad


def test_result_and_table_report_evictions():
    sc = small_kv_scenario("sglang", 1500, concurrency=16, output_len="100:300")
    r = pipesim.run(sc, warmup_requests=8, measure_requests=24, ci_target=None)
    assert r.preemptions_total >= r.preemptions > 0
    assert r.to_dict()["preemptions"] == r.preemptions
    from pipesim.report.table import table

    assert f"KV retractions {r.preemptions} ({r.preemptions_total} in the run)" in table(r)


# ---- vLLM prefix caching: a preempted request's own blocks (docs/engines.md §4) -----------


def test_free_queue_evicts_oldest_freed_first_and_shortens_the_prefix():
    # BlockPool: allocation pops the free queue's head; freed blocks join the tail; a
    # request's blocks are freed last block first, so eviction shortens its cached prefix
    q = kv.FreeBlockQueue(32)  # never-used memory at the head
    q.free(64, owner=7, cached=64)  # a preempted request's 4 blocks
    q.free(32)  # a finished request's, freed after it
    q.take(48)  # 32 never used, then 16 of request 7's
    assert q.hit(7) == 48 and q.tokens == 80
    q.take(48, rid=7, hit=48)  # it resumes: its 48 cached tokens are touched, not evicted
    assert q.hit(7) == 0 and q.tokens == 32
    q.free(16, owner=8, cached=0)  # nothing of it cached: plain free memory
    assert q.hit(8) == 0 and q.tokens == 48


def preempted_vllm(
    prefix_caching: bool, budget: int = 8192
) -> tuple[FakeSim, VLLMScheduler, Request, Request]:
    """A (64 tokens computed, 4 blocks) runs; B (a 100-token prompt) held the other 4
    blocks of an 8-block pool, 64 tokens computed, when it was preempted."""
    st = VLLMSettings(64, budget, False, 1, 128, 0.9, 0, (), prefix_caching)
    sim = FakeSim(128)
    sched = VLLMScheduler(sim, st)
    a = running_vllm(sched, 0, 64)
    b = Request(1, 0.0, 100, 10)
    for r, held, computed in ((a, 64, 63), (b, 64, 64)):
        r.kv_reserved, sched.computed[r.rid] = held, computed
        sim.kv_free -= held
        if sched.free_queue is not None:
            sched.free_queue.take(held)
    b.scheduled = b.prefilled = 64
    sched.active.append(b)
    sched._preempt(sched.active.pop())
    return sim, sched, a, b


def test_vllm_resumed_request_prefills_only_past_its_cached_prefix():
    # get_computed_blocks finds its own 4 full blocks; it computes the other 36 tokens
    sim, sched, a, b = preempted_vllm(True)
    sched.active.remove(a)  # A finished: 4 free blocks beside B's
    sim.kv_free += a.kv_reserved
    sched.free_queue.free(a.kv_reserved)
    _, prefill = sched.form()
    assert prefill == [(b, 36, 64)] and b.prefilled == 64 and b.scheduled == 100
    assert b.kv_reserved == 112 and sim.kv_free == 16 == sched.free_queue.tokens


def test_vllm_cached_blocks_count_as_needed_so_the_resumed_request_waits():
    # allocate_slots counts a hit block that sits in the free queue
    # (num_evictable_computed_blocks) as one to allocate: B's 4 cached blocks + its
    # next 15-token chunk need 5 blocks, 4 are free, so B waits and A decodes alone
    sim, sched, a, b = preempted_vllm(True, budget=16)
    decode, prefill = sched.form()
    assert decode == [a] and not prefill and list(sim.waiting) == [b] and sim.requeued == [b]
    # without prefix caching the 15-token chunk fits one free block: B is admitted, only to
    # be preempted again at its next chunk (recompute thrash)
    sim, sched, a, b = preempted_vllm(False, budget=16)
    decode, prefill = sched.form()
    assert decode == [a] and prefill == [(b, 15, 0)]


@pytest.mark.parametrize("caching,at_most_once", [(True, True), (False, False)])
def test_vllm_prompts_too_long_for_two_are_preempted_once_with_prefix_caching(caching, at_most_once):
    # two 1000-token prompts do not fit a ~1500-token pool: the second is preempted when
    # its chunks outgrow the memory the first leaves; with its blocks cached it then waits
    # (previous test) instead of re-entering and being preempted again
    sc = small_kv_scenario(
        "vllm",
        1500,
        rate_rps=1000.0,
        num_requests=6,
        input_len="1000",
        output_len="60",
        enable_prefix_caching=caching,
        max_num_batched_tokens=256,
    )
    sim = simulate(sc, 0, 6)
    open_loop_done(sim, 6)
    assert any(r.evicted for r in sim.requests)
    assert all(r.evicted <= 1 for r in sim.requests) == at_most_once
    if caching:
        assert sim.instances[0].scheduler.free_queue.tokens == sim.instances[0].kv_free

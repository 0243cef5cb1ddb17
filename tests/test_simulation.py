"""Simulation invariants: tokens conserved, determinism, pipeline physics, the
memory-bandwidth bound, KV admission."""

import pytest
from conftest import fast_predict, fast_run, profile_for, simulate, small_kv_scenario

import pipesim
from pipesim.costs.host import hop_cpu_s, step_host
from pipesim.costs.primitives import Shape
from pipesim.costs.stage import CostModel

# ---- token conservation ---------------------------------------------------------------

OPEN_LOOP = [
    dict(engine="sglang", tp=1, pp=4),
    dict(engine="sglang", tp=2, pp=2, pp_async_batch_depth=1),
    dict(engine="sglang", tp=2, pp=1, chunked_prefill_size=128),  # chunked, no PP
    dict(engine="vllm", tp=1, pp=4),
    dict(engine="vllm", tp=2, pp=2, max_num_batched_tokens=96, async_scheduling=True),
]


@pytest.mark.parametrize("cfg", OPEN_LOOP, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_tokens_conserved_open_loop(profile, cfg):
    cfg = dict(cfg)
    sc = pipesim.build_scenario(
        model="llama-3.1-8b",
        rate_rps=300.0,
        num_requests=40,
        input_len="20:300",
        output_len="1:30",
        seed=11,
        profile=profile_for(cfg["engine"]),
        **cfg,
    )
    sim = simulate(sc, 0, 40)
    reqs = sim.requests
    assert len(reqs) == 40
    # every request ran to completion, produced exactly output_len tokens
    assert all(r.finish_s >= 0 for r in reqs)
    assert all(r.generated == r.output_len and r.prefilled == r.input_len for r in reqs)
    assert sum(n for _, n in sim.record().tokens) == sum(r.output_len for r in reqs)
    # causality
    assert all(r.arrival_s <= r.first_token_s <= r.finish_s for r in reqs)
    # everything admitted was released
    eng = sim.instances[0]
    assert sim.running == eng.running == 0 and eng.kv_free == sc.settings.kv_tokens


def test_result_counts_every_token_open_loop(profile):
    sc = pipesim.build_scenario(
        tp=2,
        pp=2,
        model="llama-3.1-8b",
        rate_rps=200.0,
        num_requests=30,
        input_len="50:200",
        output_len="2:25",
        seed=4,
        profile=profile,
    )
    r = fast_run(sc, record="full")  # an open loop keeps its requests only when asked
    t0, t1 = r.window_s
    assert t0 == 0.0 and r.completed_requests == 30
    total = int(r.requests.output_len.sum())
    assert r.output_throughput_tok_s * (t1 - t0) == pytest.approx(total, rel=1e-9)
    assert r.request_throughput_req_s * (t1 - t0) == pytest.approx(30, rel=1e-9)


def test_closed_loop_keeps_concurrency(profile):
    # C clients, each sends its next request when the last has fully arrived: never more
    # than C requests alive, each client's requests one after another, the next one sent
    # after the output path (the detokenizer: a cost per step and per token in the step,
    # docs/engines.md §1)
    def by_client(prof):
        sc = pipesim.build_scenario(
            tp=1, pp=2, concurrency=5, model="llama-3.1-8b", output_len="2:20", seed=1, profile=prof
        )
        out = {}
        for r in simulate(sc, 5, 20).requests:
            out.setdefault(r.client, []).append(r)
        assert sorted(out) == list(range(5))
        return out.values()

    # the next request leaves the client the moment it saw the last token, which the
    # output path delays past the engine's return by one step's cost at least (the
    # detokenizer, then the API process's streaming: docs/host-loop.md §6.2)
    p = pipesim.build_scenario(concurrency=1, model="llama-3.1-8b", profile=profile).profile.params
    lo = (p.detokenize_step_us + p.detokenize_token_us + p.stream_step_us + p.stream_token_us) * 1e-6
    assert lo > 0 and p.host_cpu_factor > 1  # the shipped SGLang profiles carry an output path
    for reqs in by_client(profile):
        for a, b in zip(reqs, reqs[1:]):
            assert a.finish_s >= 0 and b.arrival_s == a.finish_s
    sc = pipesim.build_scenario(
        tp=1, pp=2, concurrency=5, model="llama-3.1-8b", output_len="2:20", seed=1, profile=profile
    )
    sim = simulate(sc, 5, 20)
    returns = [t for t, _ in sim.rec.tokens]
    for r in sim.requests:
        if r.finish_s >= 0:  # seen one step's output path (at least) after the return that finished it
            assert r.finish_s - max(t for t in returns if t <= r.finish_s) >= lo * p.host_cpu_factor - 1e-12


# ---- determinism ----------------------------------------------------------------------


def _strip(d):
    d = dict(d)
    d.pop("sim_wall_s")
    return d


def test_same_seed_same_result(profile):
    kw = dict(
        tp=2,
        pp=2,
        conc=6,
        model="llama-3.1-8b",
        input_len="50:300",
        output_len="5:40",
        warmup_requests=6,
        measure_requests=12,
    )
    a = fast_predict(profile, seed=7, **kw).to_dict()
    b = fast_predict(profile, seed=7, **kw).to_dict()
    assert _strip(a) == _strip(b)
    c = fast_predict(profile, seed=8, **kw).to_dict()
    assert _strip(a) != _strip(c)  # the seed drives the random lengths


# ---- physics ----------------------------------------------------------------------------


def test_pp8_single_request_tpot_is_the_round_trip(profile, kimi):
    # C=1 on PP8: a token goes through the 8 stages one after another, with 7 activation
    # hops and the sampled token relayed back to stage 0; nothing overlaps it
    out_len, in_len = 40, 256
    sc = pipesim.build_scenario(
        tp=1, pp=8, concurrency=1, input_len=str(in_len), output_len=str(out_len), profile=profile
    )
    sim = simulate(sc, 1, 2)
    done = [r for r in sim.requests if r.finish_s >= 0]
    assert len(done) >= 3
    costs = CostModel(sc.box, sc.model, sc.plan, sc.profile)
    # decode contexts run from in_len to in_len + out_len
    sums = [
        sum(sum(costs.stage_time(s, Shape(decode=1, decode_ctx=ctx))) for s in range(8))
        for ctx in (in_len, in_len + out_len // 2, in_len + out_len)
    ]
    stage_min, stage_max = min(sums), max(sums)
    box = sc.box
    act = 2 * 7168 * 2  # hidden + residual, one token, bf16 (physics.md §2)
    hops = sum(box.p2p_time_s(s, s + 1, act) for s in range(7)) + box.p2p_time_s(7, 0, 4)
    assert hops > 0
    # the host's part of a round trip: the metadata relayed over the CPU group at each of
    # the 8 hops, and one scheduler iteration (schedule + input preparation) of the request
    host = sc.profile.params
    relay = 8 * hop_cpu_s(host)
    loop = step_host(host, 1, 0, 1).cpu_step_s
    assert relay > 0 and loop > 0
    for r in done:
        tpot = (r.finish_s - r.first_token_s) / (r.output_len - 1)
        assert tpot >= stage_min + hops - 1e-12
        assert tpot <= (stage_max + hops + relay + loop) * 1.03


def test_tp8_tpot_at_least_compute_plus_allreduce(profile):
    sc = pipesim.build_scenario(tp=8, pp=1, concurrency=1, output_len="30", profile=profile)
    sim = simulate(sc, 1, 1)
    costs = CostModel(sc.box, sc.model, sc.plan, sc.profile)
    compute, comm = costs.stage_time(0, Shape(decode=1, decode_ctx=256))
    assert comm >= 123 * costs.allreduce_time(tuple(range(8)), 7168 * 2)
    for r in sim.requests:
        if r.finish_s >= 0:
            assert (r.finish_s - r.first_token_s) / (r.output_len - 1) >= (compute + comm) * (1 - 1e-9)


def kimi_decode_bytes_per_token() -> float:
    """A lower bound on the bytes one decode token of Kimi K2.6 reads from GPU memory,
    from the architecture (physics.md §2), counted by hand. Every term is an
    underestimate, so the bound on throughput it gives is safe:
    - attention projections: ~101 M params per layer in bf16 (counted below), 61 layers;
    - shared expert: 3 x 7168 x 2048 params bf16 in each of the 60 MoE layers;
    - routed experts: a token reads its top-8 experts, 24.8 MB each in INT4, 60 layers;
    - the dense MLP of layer 0: 3 x 7168 x 18432 params bf16;
    - lm_head: 163840 x 7168 bf16 (logits are computed for every decode token).
    Left out (they only add bytes): norms, router, KV cache, activations."""
    attn = 7168 * 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168
    assert attn / 1e6 == pytest.approx(101, rel=0.01)
    shared = 3 * 7168 * 2048
    expert_int4 = 3 * 7168 * 2048 * 4.5 / 8
    return 61 * attn * 2 + 60 * shared * 2 + 60 * 8 * expert_int4 + 3 * 7168 * 18432 * 2 + 163840 * 7168 * 2


# Memory bandwidth per GPU, taken at the top of physics.md §3's range (1.6-1.8 TB/s; the
# datasheet's 1.792 TB/s is the faster Workstation card): a generous bandwidth makes
# the bound loose, so the test cannot fail on the uncertainty in the figure.
BW_MAX = 1.8e12


def test_tp8_c1_below_bandwidth_bound(profile):
    # TP8: the 8 GPUs read their shares of the weights in parallel
    bound = 8 * BW_MAX / kimi_decode_bytes_per_token()
    assert 300 < bound < 600  # ~32.5 GB per token -> ~440 tok/s
    r = fast_predict(profile, tp=8, pp=1, conc=1, output_len="40", warmup_requests=1, measure_requests=2)
    assert 0 < r.output_throughput_tok_s <= bound
    assert r.per_request_tok_s <= bound


def test_pp8_c1_below_bandwidth_bound(profile):
    # PP8 with one request: the stages run one after another, so only one GPU reads
    # weights at any time and the whole model passes through one GPU's bandwidth
    bound = BW_MAX / kimi_decode_bytes_per_token()
    r = fast_predict(profile, tp=1, pp=8, conc=1, output_len="40", warmup_requests=1, measure_requests=2)
    assert 0 < r.output_throughput_tok_s <= bound
    assert r.per_request_tok_s <= bound


def test_pp8_stages_take_turns_at_c1(profile):
    # with one request no two stages compute at the same time
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=1, output_len="10", profile=profile)
    sim = simulate(sc, 1, 1)
    intervals = sorted(iv for s in range(8) for iv in sim.record().compute[s])
    for (_a0, a1), (b0, _b1) in zip(intervals, intervals[1:]):
        assert b0 >= a1 - 1e-15


# ---- KV admission -----------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_kv_pool_never_overcommits(engine):
    # docs/engines.md §4: memory is taken as batches are formed and given back when a
    # request finishes or is evicted, so at every launch the requests hold exactly what
    # the pool lacks, and never more than the pool
    sc = small_kv_scenario(engine)
    kv = sc.settings.kv_tokens
    peak = {"alive": 0}

    def setup(sim):
        eng = sim.instances[0]
        orig = eng.launch

        def launch(slot, decode, prefill):
            mb = orig(slot, decode, prefill)
            held = sum(r.kv_reserved for r in sim.requests if r.finish_s < 0)  # counted by hand
            assert 0 <= eng.kv_free and held == kv - eng.kv_free, (held, kv, eng.kv_free)
            peak["alive"] = max(
                peak["alive"], sum(1 for r in sim.requests if r.kv_reserved and r.finish_s < 0)
            )
            return mb

        eng.launch = launch

    sim = simulate(sc, 16, 32, setup)
    assert sim.completed >= 48
    # not vacuous: the pool was the limit (16 clients, fewer holding KV at once)
    assert peak["alive"] < 16

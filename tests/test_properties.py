"""Physical invariants over random valid scenarios (hypothesis).

Dense Llama-3.1-8B on the reference box keeps every run small; each property states
what could go wrong and checks it against physics or bookkeeping, never against
another run of the same code path.
"""

from __future__ import annotations

import pytest
from conftest import profile_for, simulate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipesim
from pipesim.profiles.profile import load_profile

PROFILE = "rtx-pro-6000-sglang-healthy"
SETTINGS = settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
BW_MAX = 1.792e12  # the card's datasheet memory bandwidth, the most it can read (physics.md §3)

splits = st.sampled_from([(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (1, 4), (2, 2), (2, 4), (4, 2), (1, 8)])


@st.composite
def scenarios(draw, kind="closed"):
    tp, pp = draw(splits)
    engine = draw(st.sampled_from(["sglang", "vllm"]))
    lens = dict(
        input_len=str(draw(st.integers(8, 96))),
        output_len=f"{draw(st.integers(2, 12))}:{draw(st.integers(12, 30))}",
    )
    seed = draw(st.integers(0, 10_000))
    base = dict(
        tp=tp, pp=pp, model="llama-3.1-8b", profile=profile_for(engine), engine=engine, seed=seed, **lens
    )
    if kind == "closed":
        return dict(base, concurrency=draw(st.integers(1, 24)))
    return dict(base, rate_rps=draw(st.floats(0.5, 50)), num_requests=draw(st.integers(1, 30)))


@SETTINGS
@given(scenarios(kind="open"))
def test_every_token_requested_is_produced_once(kw):
    sc = pipesim.build_scenario(**kw)
    sim = simulate(sc, 0, sc.workload.num_requests)
    assert all(r.finish_s >= 0 for r in sim.requests)  # all finished
    assert all(r.generated == r.output_len for r in sim.requests)  # each exactly its length
    assert all(r.prefilled == r.input_len for r in sim.requests)  # every prompt token once
    assert sum(n for _, n in sim.record().tokens) == sum(r.output_len for r in sim.requests)
    assert sim.instances[0].kv_free == sc.settings.kv_tokens  # all KV returned


@SETTINGS
@given(scenarios())
def test_throughput_below_the_memory_bandwidth_bound(kw):
    """Each micro-batch of at most C tokens reads all of a stage's weights on every GPU
    of the stage: a stage passes at most C x BW / weight bytes per GPU tokens per second."""
    sc = pipesim.build_scenario(**kw)
    r = pipesim.run(sc, measure_requests=16, ci_target=None)
    per_gpu = max(sc.memory.weights_per_gpu_bytes)
    bound = sc.workload.concurrency * BW_MAX / per_gpu
    assert r.output_throughput_tok_s <= bound * 1.0001


@SETTINGS
@given(scenarios())
def test_littles_law_in_a_closed_loop(kw):
    """C clients, each with one request in the system (its latency runs until its last
    token has crossed the output path, docs/host-loop.md §6.2), or none once the run
    ends: C = request rate x mean latency over the run."""
    sc = pipesim.build_scenario(**kw)
    sim = simulate(sc, sc.workload.concurrency, 4 * sc.workload.concurrency + 8)
    done = [r for r in sim.requests if r.finish_s >= 0]
    t0, t1 = 0.0, sim.env.now
    # over the whole run, every request's time in the system is counted exactly once
    in_system = sum(r.finish_s - r.arrival_s for r in done) + sum(
        t1 - r.arrival_s for r in sim.requests if r.finish_s < 0
    )
    # and every client's wait between a response and its next request
    by_client = {}
    for r in sim.requests:
        by_client.setdefault(r.client, []).append(r)
    waits = []
    for reqs in by_client.values():
        waits += [b.arrival_s - a.finish_s for a, b in zip(reqs, reqs[1:])]
        if reqs[-1].finish_s >= 0:
            waits.append(t1 - reqs[-1].finish_s)  # its next request not sent when the run ended
    assert min(waits, default=0.0) >= 0  # never two requests of one client in the system
    # a client sends its next request the moment it sees the last token: the output
    # path's time is inside the finished request's latency (frontend.py `deliver`)
    assert all(b.arrival_s == a.finish_s for reqs in by_client.values() for a, b in zip(reqs, reqs[1:]))
    assert (in_system + sum(waits)) / (t1 - t0) == pytest.approx(sc.workload.concurrency, rel=1e-6)


@SETTINGS
@given(scenarios())
def test_littles_law_from_the_reported_metrics(kw):
    """The reported request rate times the reported mean latency gives back C, within
    the run's own confidence interval (plus the edge of a finite window)."""
    c = kw["concurrency"]
    r = pipesim.predict(conc=c, **{k: v for k, v in kw.items() if k != "concurrency"}, intervals=False)
    rel_ci = r.output_throughput_ci_tok_s / r.output_throughput_tok_s
    window_s = r.window_s[1] - r.window_s[0]
    edge = c * (r.e2e_ms_mean / 1e3) / window_s  # requests straddling the window's ends
    little = r.request_throughput_req_s * r.e2e_ms_mean / 1e3
    assert little == pytest.approx(c, rel=2 * rel_ci + edge + 1e-6)


@SETTINGS
@given(scenarios(), st.floats(0.1, 0.9))
def test_cheaper_allreduce_never_lowers_tp_throughput(kw, factor):
    conc = kw["concurrency"]
    kw = {k: v for k, v in kw.items() if k not in ("concurrency", "profile")}
    kw.update(pp=1, tp=max(2, kw["tp"]), input_len="32", output_len="16")
    base = load_profile(profile_for(kw["engine"]))
    run = dict(conc=conc, ci_target=None, measure_requests=12, **kw)
    slow = pipesim.predict(profile=base, **run, intervals=False)
    fast = pipesim.predict(profile=base.with_params(allreduce_scale=factor), **run, intervals=False)
    assert fast.output_throughput_tok_s >= slow.output_throughput_tok_s * (1 - 1e-9)


@SETTINGS
@given(scenarios())
def test_same_seed_same_result(kw):
    a = pipesim.predict(
        conc=kw["concurrency"], **{k: v for k, v in kw.items() if k != "concurrency"}, intervals=False
    ).to_dict()
    b = pipesim.predict(
        conc=kw["concurrency"], **{k: v for k, v in kw.items() if k != "concurrency"}, intervals=False
    ).to_dict()
    a.pop("sim_wall_s"), b.pop("sim_wall_s")
    assert a == b


@SETTINGS
@given(scenarios(), st.integers(1, 1000))
def test_another_seed_stays_within_the_interval(kw, delta):
    """Two seeds are two samples of the same steady state: their estimates differ by
    no more than their intervals allow (95% half-widths, doubled: batch means are
    approximate at the smallest runs)."""
    c = kw.pop("concurrency")
    a = pipesim.predict(conc=c, **kw, intervals=False)
    b = pipesim.predict(conc=c, **dict(kw, seed=kw["seed"] + delta), intervals=False)
    slack = 2 * (a.output_throughput_ci_tok_s + b.output_throughput_ci_tok_s) + 1e-9
    assert abs(a.output_throughput_tok_s - b.output_throughput_tok_s) <= slack

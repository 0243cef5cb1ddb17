"""The steady-state model (scenario/steady_model.py, slot_schedule.py, host_loop.py)
against cases worked by hand from the cost model, its engine rules (caps, slots), its
invariants, and where it says it is outside its domain. Its agreement with the
simulation is measured, not asserted here: calibration/validate_steady_model.py and
docs/search.md §2."""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import no_host_loop

import pipesim
from pipesim.costs.host import StepHost, compose
from pipesim.costs.primitives import ACT_BYTES, Shape
from pipesim.costs.stage import CostModel
from pipesim.profiles.profile import HOST_PARAMS
from pipesim.scenario.host_loop import host_loop
from pipesim.scenario.slot_schedule import TOKEN_ID_BYTES, RankSchedule
from pipesim.scenario.steady_model import estimate, steady_state

SCENARIO = Path(pipesim.__file__).parent / "scenario"
QUIET = dict(
    frontend_ms=0.0, detokenize_step_us=0.0, detokenize_token_us=0.0, cpu_iteration_ms=0.0, cpu_hop_ms=0.0
)


def quiet(sc):
    """The scenario's profile with every host-loop term zero: the GPU and links alone."""
    return replace(sc, profile=no_host_loop(sc.profile, **QUIET))


def costs_of(sc) -> CostModel:
    return CostModel(sc.box, sc.model, sc.plan, sc.profile)


def stage_sum(cm: CostModel, shape: Shape) -> float:
    return sum(sum(cm.stage_time(s, shape)) for s in range(cm.plan.pp))


def decode_shape(sc, batch: int, ctx: int) -> Shape:
    """A decode batch as the engine forms it: graphed and padded to the captured size."""
    pad = sc.settings.graph_tokens(batch, 0) - batch
    rows = batch + max(pad, 0)
    return Shape(rows, batch * ctx // rows, (), sc.settings.graphed(batch, 0))


# ---- hand-worked cases ----------------------------------------------------------------------


@pytest.mark.parametrize("conc", [1, 8, 24])
def test_one_stage_closed_loop_is_c_outputs_over_prefill_plus_decode_steps(profile, conc):
    """TP8, one stage, no host terms, C clients whose prompts fit one prefill batch:
    each lifetime is one prefill pass of the C prompts and O - 1 decode steps of C
    (context: prompt + half the outputs), so throughput = C x O / (prefill + (O-1) x step)."""
    sc = quiet(
        pipesim.build_scenario(
            tp=8,
            pp=1,
            concurrency=conc,
            input_len="256",
            output_len="100",
            profile=profile,
            model="llama-3.1-70b",
        )
    )
    cm = costs_of(sc)
    prefill = stage_sum(cm, Shape(0, 0, ((256, 0),) * conc, False))
    step = stage_sum(cm, decode_shape(sc, conc, 256 + 50))
    want = conc * 100 / (prefill + 99 * step)
    est = steady_state(cm, sc.settings, sc.workload)
    assert est.domain == "in" and est.occupancy == (conc,)
    assert est.output_throughput_tok_s == pytest.approx(want, rel=1e-9)
    assert est.tpot_ms == pytest.approx(step * 1e3, rel=1e-9)
    assert est.ttft_ms == pytest.approx(prefill * 1e3, rel=1e-9)
    assert est.per_request_tok_s == pytest.approx(1 / step, rel=1e-9)


@pytest.mark.parametrize("tp,pp", [(2, 4), (1, 8), (4, 2)])
def test_one_request_through_a_pipeline_gets_one_token_per_round_trip(profile, tp, pp):
    """PP with one request: its next token is sampled only after the last one came back,
    so TPOT is a whole trip: every stage, every hop forward (hidden states + residual,
    bf16) and the token id back to the first stage."""
    sc = quiet(
        pipesim.build_scenario(tp=tp, pp=pp, concurrency=1, input_len="64", output_len="50", profile=profile)
    )
    cm = costs_of(sc)
    shape = decode_shape(sc, 1, 64 + 25)
    hop_bytes = shape.tokens * 2 * sc.model.hidden * ACT_BYTES
    trip = (
        stage_sum(cm, shape)
        + sum(cm.hop_time(s, s + 1, hop_bytes) for s in range(pp - 1))
        + cm.hop_time(pp - 1, 0, TOKEN_ID_BYTES)
    )
    est = steady_state(cm, sc.settings, sc.workload)
    assert est.tpot_ms == pytest.approx(trip * 1e3, rel=1e-9)
    assert est.output_throughput_tok_s < 1e3 / est.tpot_ms  # and its prompt's pass besides


def test_the_token_going_back_is_the_simulations():
    from pipesim.sim.pipeline import TOKEN_ID_BYTES as SIMULATED

    assert TOKEN_ID_BYTES == SIMULATED


def test_a_full_pipeline_is_bounded_by_its_busiest_stage(profile):
    """Async depth 1 gives SGLang pp + 1 slots: with every slot full (C = slots x cap)
    a round lasts the longer of one batch's trip and the busiest stage's work for all
    five batches; here the stage's, so the pipeline has no bubble."""
    sc = quiet(
        pipesim.build_scenario(
            tp=2,
            pp=4,
            concurrency=5 * 8,
            profile=profile,
            pp_async_batch_depth=1,
            max_running_requests=40,
            pp_max_micro_batch_size=8,
        )
    )
    cm = costs_of(sc)
    shape = decode_shape(sc, 8, 256 + 150)
    busiest = max(sum(cm.stage_time(s, shape)) for s in range(4))
    hop_bytes = shape.tokens * 2 * sc.model.hidden * ACT_BYTES
    trip = stage_sum(cm, shape) + sum(cm.hop_time(s, s + 1, hop_bytes) for s in range(3))
    trip += cm.hop_time(3, 0, 8 * TOKEN_ID_BYTES)
    est = steady_state(cm, sc.settings, sc.workload)
    assert est.occupancy == (8,) * 5
    assert 5 * busiest > trip
    assert est.round_ms == pytest.approx(5 * busiest * 1e3, rel=1e-12)


# ---- the engines' caps -------------------------------------------------------------------------


def test_a_closed_loop_past_its_running_cap_queues(profile):
    """Clients beyond max_running_requests only queue: the same throughput, and each
    waits (Little) the clients added over the rate longer for its first token."""
    kw = dict(tp=8, pp=1, profile=profile, max_running_requests=32, input_len="128", output_len="64")
    at, past = (estimate(pipesim.build_scenario(concurrency=c, **kw)) for c in (64, 128))
    assert at.admitted == past.admitted == 32
    assert past.output_throughput_tok_s == pytest.approx(at.output_throughput_tok_s, rel=1e-9)
    waited = 64 / at.request_throughput_req_s * 1e3
    assert past.ttft_ms - at.ttft_ms == pytest.approx(waited, rel=1e-6)


def test_sglang_runs_at_most_its_slots_times_its_per_slot_cap(profile):
    sc = pipesim.build_scenario(
        tp=2, pp=4, concurrency=64, profile=profile, max_running_requests=64, pp_max_micro_batch_size=6
    )
    est = estimate(sc)
    assert est.admitted == 4 * 6 and sum(est.occupancy) == 24 and max(est.occupancy) <= 6


def test_vllm_groups_are_its_batches_in_flight(vllm_profile):
    """vLLM PP4 without async scheduling, every request at once (no front end): at most 4
    batches in flight, so 4 groups, each prompt batch within the token budget with its
    group's decodes (8192 tokens: 31 prompts of 256 beside 64 decodes)."""
    sc = quiet(pipesim.build_scenario(tp=2, pp=4, concurrency=256, engine="vllm", profile=vllm_profile))
    est = estimate(sc)
    assert len(est.occupancy) == 4 and sum(est.occupancy) == 256
    assert (31 * 256 + 64 - 31) <= 8192 < 32 * 256 + 64 - 32
    assert all(size % 31 in (0, 8) for size in est.occupancy)  # eight cohorts of 31, one of 8


# ---- invariants ----------------------------------------------------------------------------------


@pytest.mark.parametrize("tp,pp", [(8, 1), (4, 2), (2, 4), (1, 8)])
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_throughput_does_not_fall_with_more_clients_up_to_the_cap(profile, vllm_profile, tp, pp, engine):
    """The simulation's throughput rises with C up to the running cap on every split of
    the reference box (docs/search.md §2's grid); the model's does too."""
    prof = profile if engine == "sglang" else vllm_profile
    xs = [
        estimate(
            pipesim.build_scenario(tp=tp, pp=pp, concurrency=c, engine=engine, profile=prof)
        ).output_throughput_tok_s
        for c in (1, 2, 4, 8, 16, 32, 64)
    ]
    assert all(b >= a for a, b in zip(xs, xs[1:])), xs


def test_a_faster_kernel_never_slows_the_estimate(profile):
    base = dict(tp=2, pp=4, concurrency=32, profile=profile)
    slow, fast = (estimate(pipesim.build_scenario(**base, kernel_scale=k)) for k in (1.0, 0.5))
    assert fast.output_throughput_tok_s > slow.output_throughput_tok_s
    assert fast.tpot_ms < slow.tpot_ms and fast.ttft_ms < slow.ttft_ms


def test_the_bracket_holds_the_point(profile):
    """Fixed lengths at C=64 with a per-slot cap of 64: the cohorts may merge into one slot
    or spread over the four; the point (the formation) lies in the bracket, whose lower
    end is the merged slot."""
    sc = pipesim.build_scenario(tp=2, pp=4, concurrency=64, max_running_requests=256, profile=profile)
    est = estimate(sc)
    assert est.domain == "bracketed"
    lo, hi = est.bounds["output_throughput_tok_s"]
    assert lo < est.output_throughput_tok_s <= hi
    assert 64 in [sum(st.sizes) for st in est.states] and (64,) in [st.sizes for st in est.states]
    assert (16, 16, 16, 16) in [st.sizes for st in est.states]
    assert est.band("output_throughput_tok_s", 0.1) == (lo / 1.1, hi * 1.1)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_pipeline_s_slot_filling_is_bracketed_a_single_slot_s_is_not(profile, vllm_profile, engine):
    """Which slot a request joins follows when it reaches the scheduler; with one slot
    (or one group) there is no choice."""
    prof = profile if engine == "sglang" else vllm_profile
    for tp, pp, domain in ((8, 1, "in"), (2, 4, "bracketed")):
        est = estimate(pipesim.build_scenario(tp=tp, pp=pp, concurrency=32, engine=engine, profile=prof))
        assert est.domain == domain
        for m, (lo, hi) in est.bounds.items():
            assert lo <= getattr(est, m) <= hi, m


# ---- where it says it does not know --------------------------------------------------------------


def test_a_kv_bound_closed_loop_is_outside_the_domain(profile):
    sc = pipesim.build_scenario(
        tp=1, pp=8, concurrency=64, output_len=1000, mem_fraction_static=0.803, profile=profile
    )
    est = estimate(sc)
    assert est.domain == "outside" and "KV cache" in est.notes[-1]
    assert math.isnan(est.output_throughput_tok_s) and est.bounds["output_throughput_tok_s"][0] == 0.0
    assert est.bounds["output_throughput_tok_s"][1] > 0 and est.bounds["ttft_ms"][1] == math.inf


def test_an_overloaded_open_loop_says_so(profile):
    est = estimate(pipesim.build_scenario(tp=2, pp=4, rate_rps=50.0, num_requests=200, profile=profile))
    assert est.overloaded and est.domain == "outside" and est.notes[-1].startswith("overloaded")


def test_vllm_async_scheduling_with_pp_is_outside_the_domain(vllm_profile):
    sc = pipesim.build_scenario(
        tp=2, pp=4, concurrency=8, engine="vllm", profile=vllm_profile, async_scheduling=True
    )
    assert estimate(sc).domain == "outside"


def test_an_open_loop_below_saturation_serves_what_arrives(profile):
    """Below capacity the run serves every arrival: its throughput is its requests'
    outputs over the last arrival (its arrival plan, drawn from its seed) plus a stay,
    as the simulation measures an open loop from its start to its last finish."""
    import numpy as np

    from pipesim.inputs.workload import ArrivalPlan

    sc = pipesim.build_scenario(tp=8, pp=1, rate_rps=0.5, num_requests=400, output_len="100", profile=profile)
    est = estimate(sc)
    last = ArrivalPlan(sc.workload, np.random.default_rng(sc.workload.seed)).span_s[1]
    stay_s = (est.ttft_ms + 99 * est.tpot_ms) * 1e-3
    assert est.domain == "in" and not est.overloaded
    assert est.output_throughput_tok_s == pytest.approx(400 * 100 / (last + stay_s), rel=1e-9)


# ---- the host loop: costs/host.py's terms, the release's rules ----------------------------------------

F = 1.68  # the default host_cpu_factor (pipesim/data/host_loop.toml)
B = 16
LLAMA = dict(model="llama-3.1-8b", box="h100-sxm-8x", tp=1, concurrency=B, input_len="32", output_len="300")


def us(x: float) -> float:
    return x * F * 1e-6


def decode_round(**kw) -> tuple[float, float]:
    """(the model's decode round, the GPU's step for it): B requests in one slot, their
    context 32 + 150, as the engine pads the batch."""
    sc = pipesim.build_scenario(**{**LLAMA, **kw})
    est = estimate(sc)
    assert est.occupancy == (B,)
    cm = costs_of(sc)
    return est.round_ms * 1e-3, stage_sum(cm, decode_shape(sc, B, 32 + 150))


# the engine loop's CPU before a launch of B decodes (host_loop.toml): sched + prep
V1_CPU = us(15 + 7.87 * B + 100 + B)
V0_CPU = us(28 + 12.37 * B + 100 + B)
V0_OUT = us(24 + 24 * B)  # V0's output processing
SGLANG_CPU = us(64 + 6.57 * B + 100 + B)


@pytest.mark.parametrize(
    "kw, step",
    [
        (dict(engine="vllm", engine_version="0.13.0"), lambda gpu: V1_CPU + gpu),
        (dict(engine="vllm", engine_version="0.14.0"), lambda gpu: max(gpu, V1_CPU)),
        (dict(engine="vllm", engine_version="0.6.3.post1"), lambda gpu: V0_CPU + max(gpu, V0_OUT)),
        (
            dict(engine="vllm", engine_version="0.6.3.post1", disable_async_output_proc=True),
            lambda gpu: V0_CPU + gpu + V0_OUT,
        ),
        (
            dict(engine="vllm", engine_version="0.6.3.post1", num_scheduler_steps=4),
            lambda gpu: V0_CPU / 4 + max(gpu, V0_OUT),
        ),
        (dict(engine="sglang", engine_version="0.5.2"), lambda gpu: max(gpu, SGLANG_CPU)),
        (
            dict(engine="sglang", engine_version="0.5.2", disable_overlap_schedule=True),
            lambda gpu: SGLANG_CPU + gpu,
        ),
        (
            dict(engine="sglang", engine_version="0.5.2", disable_overlap_schedule=True, tp=2),
            lambda gpu: SGLANG_CPU + us(75 + 16.5) + gpu,
        ),
    ],
)
def test_a_decode_round_is_the_releases_step_by_hand(kw, step):
    """The model's decode round of one slot is docs/host-loop.md §6.2's step for the
    release, worked from host_loop.toml's terms (as tests/test_host_loop.py checks the
    simulation's): V1 without async scheduling pays the CPU in series, with it beside
    the GPU; V0 hides its output processing under the next step with the async output
    processor, not without it, and schedules once per N steps with multi-step; SGLang's
    overlap scheduler hides its CPU, and without it the TP broadcast adds to it."""
    round_s, gpu = decode_round(**kw)
    assert round_s == pytest.approx(step(gpu), rel=1e-9)


def test_eager_launches_on_the_engine_core_thread_add_to_the_step():
    """vLLM 0.13 --enforce-eager at TP1, the GPU made negligible: the stage waits for the
    launch of 32 layers x 10 kernels + 10 outside them at 14.9 us x 1.68 each, and the
    engine core's thread launches after its CPU: sched + prep + launch."""
    launch = us((32 * 10 + 10) * 14.9)
    round_s, gpu = decode_round(
        engine="vllm", engine_version="0.13.0", enforce_eager=True, kernel_scale=0.001
    )
    assert gpu == pytest.approx(launch, rel=1e-9)
    assert round_s == pytest.approx(V1_CPU + launch, rel=1e-9)


def test_host_loop_composes_costs_host_s_terms(profile):
    """Every term is costs/host.py's: the loop's CPU before a launch is what the engines
    charge (`HostCosts.before_launch`), the step is `compose` with the release's rules,
    the front end, an empty slot iteration and the output path are HostCosts'."""
    sc = pipesim.build_scenario(tp=4, pp=2, concurrency=8, profile=profile)
    cm = costs_of(sc)
    h = host_loop(cm.host, sc.settings)
    assert h.frontend_s == cm.host.frontend_s and h.empty_s == cm.host.empty_s
    assert h.ranks_run_loop and not h.overlap  # SGLang PP: every rank runs the loop, no overlap
    before = sum(s for _, s in cm.host.before_launch(8, 512))
    got = h.batch(0.05, 8, 512, graphed=False)
    want = compose(
        0.05,
        StepHost(before, 0.0, 0.0, cm.host.step(8, 512).out_step_s),
        cm.host.launch_s(0, False, True),
        overlap=False,
        launch_on_loop=True,
    )
    assert got.step == want and got.before_s == before
    assert got.rank_loop_s == (want.host_s, before + cm.host.launch_s(1, False, True))
    assert h.delay_s(8) == pytest.approx(sum(cm.host.output(8)))


def test_the_output_path_caps_the_estimate():
    """SGLang's detokenizer at 1 ms per token (factor 1.68): the serial process serves at
    most 1 / 1.68 ms = 595 tok/s however fast the GPU; the model's closed loop settles
    at that pace (the simulation's, tests/test_host_loop.py, just under it)."""
    sc = pipesim.build_scenario(engine="sglang", **{**LLAMA, "concurrency": 64, "output_len": "100"})
    prof = sc.profile.with_params(detokenize_token_us=1000.0, detokenize_step_us=0.0, stream_token_us=0.0)
    est = estimate(replace(sc, profile=prof))
    assert est.output_throughput_tok_s == pytest.approx(1 / 1.68e-3, rel=1e-9)
    # a client sees its tokens as the process passes them: their spacing stretches by
    # the process's load (the simulation's TPOT grows so, its TTFT hardly)
    free = estimate(replace(sc, profile=sc.profile.with_params(detokenize_token_us=0.0)))
    assert est.tpot_ms > 2 * free.tpot_ms


def test_data_parallel_ranks_share_one_output_path():
    """Four SGLang replicas (DP4) behind one front end (sim/frontend.py): the detokenizer
    at 1 ms per token caps the whole engine at 595 tok/s, not each rank."""
    sc = pipesim.build_scenario(
        engine="sglang", **{**LLAMA, "dp": 4, "concurrency": 256, "output_len": "100"}
    )
    prof = sc.profile.with_params(detokenize_token_us=1000.0, detokenize_step_us=0.0, stream_token_us=0.0)
    est = estimate(replace(sc, profile=prof))
    assert est.output_throughput_tok_s == pytest.approx(1 / 1.68e-3, rel=1e-9)


def test_a_later_pp_rank_launches_after_its_own_run_of_the_iteration(profile):
    """SGLang PP2, one request, the GPU negligible and the scheduler's CPU large (5 ms):
    the second rank launches the batch only after the first rank's launch, the metadata
    relay and its own run of the iteration, so a token's trip is the first stage, then
    relay + CPU, then the second stage and the way back (sim/pipeline.py)."""
    sc = pipesim.build_scenario(tp=4, pp=2, concurrency=1, input_len="32", output_len="50", profile=profile)
    prof = no_host_loop(sc.profile, **{**QUIET, "sched_base_us": 5000.0, "cpu_hop_ms": 0.2})
    sc = replace(sc, profile=prof)
    cm = costs_of(sc)
    shape = decode_shape(sc, 1, 32 + 25)
    cpu = sum(s for _, s in cm.host.before_launch(1, 0))
    assert cpu == pytest.approx(5e-3)  # the scheduler's alone: no_host_loop zeroes the rest (factor 1)
    s0, s1 = (sum(cm.stage_time(s, shape)) for s in range(2))
    hop = cm.hop_time(0, 1, shape.tokens * 2 * sc.model.hidden * ACT_BYTES)
    back = cm.hop_time(1, 0, TOKEN_ID_BYTES)
    trip = max(s0 + hop, 0.2e-3 + cpu) + s1 + back
    assert 0.2e-3 + cpu > s0 + hop  # the rank's CPU binds
    est = steady_state(cm, sc.settings, sc.workload)
    assert est.tpot_ms * 1e-3 == pytest.approx(cpu + trip, rel=1e-9)


def test_requests_reach_an_idle_rank_one_at_a_time(profile):
    """A serial front end hands a request over every frontend_s: the idle rank prefills
    the first alone, and its next batch takes the requests that arrived meanwhile (one
    slot: until that first batch is back and the loop's CPU has run)."""
    sc = pipesim.build_scenario(
        **{**LLAMA, "concurrency": 64, "engine": "sglang", "disable_overlap_schedule": True}
    )
    cm = costs_of(sc)
    rank = RankSchedule(cm, sc.settings, host_loop(cm.host, sc.settings), sc.workload)
    f = cm.host.frontend_s
    first = rank.batch(0, ((32, 0),))
    assert first.cycle_s == pytest.approx(first.before_s + first.latency_s)
    cohorts = rank.cohorts(64, split_first=True)
    assert cohorts[:2] == [1, min(rank.per_cohort, int(first.cycle_s / f))] and sum(cohorts) == 64
    assert rank.per_cohort == sc.settings.prefill_budget // 32  # 256 whole prompts a batch
    assert rank.cohorts(64, split_first=False) == [64]  # all at once: one prefill batch


def test_vllm_v0_without_chunked_prefill_runs_a_prompt_alone():
    """V0 below 32K context: a step that admits prompts runs them alone (no mixing), as
    SGLang's prefill-first does; with chunked prefill, and in V1, prompts ride with decodes."""
    kw = dict(model="gemma-2-9b", box="h100-sxm-8x", tp=1, concurrency=8, engine="vllm")
    v0 = pipesim.build_scenario(engine_version="0.6.3.post1", **kw).settings
    assert not v0.chunked_prefill and not v0.mixes_prefill
    assert pipesim.build_scenario(
        engine_version="0.6.3.post1", enable_chunked_prefill=True, **kw
    ).settings.mixes_prefill
    assert pipesim.build_scenario(engine_version="0.19.0", **kw).settings.mixes_prefill


def test_the_model_reads_host_terms_only_through_costs_host():
    """No module of the model reads a host-loop parameter of the profile itself: the
    slot schedule and the estimate reach the host through host_loop.py, which takes
    every term from costs/host.py (its functions and `compose`), so the host loop's
    arithmetic lives in one place."""
    terms = set(HOST_PARAMS) | {
        "cpu_iteration_ms",
        "cpu_hop_ms",
        "frontend_ms",
        "detokenize_step_us",
        "detokenize_token_us",
        "eager_launch_us_per_layer",
        "host_cpu_factor",
    }
    for name in ("steady_model.py", "slot_schedule.py", "open_loop.py", "host_loop.py"):
        tree = ast.parse((SCENARIO / name).read_text())
        read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not read & terms, name

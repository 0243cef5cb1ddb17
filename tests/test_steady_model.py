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

import pipesim
from pipesim.costs.primitives import ACT_BYTES, Shape
from pipesim.costs.stage import CostModel
from pipesim.scenario.host_loop import host_loop
from pipesim.scenario.slot_schedule import TOKEN_ID_BYTES
from pipesim.scenario.steady_model import estimate, steady_state

SCENARIO = Path(pipesim.__file__).parent / "scenario"
QUIET = dict(
    frontend_ms=0.0, detokenize_step_us=0.0, detokenize_token_us=0.0, cpu_iteration_ms=0.0, cpu_hop_ms=0.0
)


def quiet(sc):
    """The scenario's profile with every host-loop term zero: the GPU and links alone."""
    return replace(sc, profile=sc.profile.with_params(**QUIET))


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
    """vLLM PP4 without async scheduling: at most 4 batches in flight, so 4 groups of a
    prefill batch's prompts each (8192 tokens / 256)."""
    sc = pipesim.build_scenario(tp=2, pp=4, concurrency=256, engine="vllm", profile=vllm_profile)
    est = estimate(sc)
    assert est.occupancy == (64, 64, 64, 64)


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
    """Fixed lengths at C=64 with a per-slot cap of 64: the cohorts of the clients' burst
    may merge into one slot; the point (the formation) is the bracket's upper end."""
    est = estimate(
        pipesim.build_scenario(tp=2, pp=4, concurrency=64, max_running_requests=256, profile=profile)
    )
    assert est.domain == "bracketed"
    lo, hi = est.bounds["output_throughput_tok_s"]
    assert lo < hi and est.output_throughput_tok_s == hi
    assert est.band("output_throughput_tok_s", 0.1) == (lo / 1.1, hi * 1.1)


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


# ---- the host loop: one function ---------------------------------------------------------------------


def test_host_loop_takes_every_term_from_the_profile(profile):
    p = profile.params
    h = host_loop(p, pipesim.build_scenario(tp=8, concurrency=1, profile=profile).settings)
    assert h.iteration_s == p.cpu_iteration_ms * 1e-3 and h.hop_s == p.cpu_hop_ms * 1e-3
    assert h.frontend_s == p.frontend_ms * 1e-3
    assert h.detokenize_s(10) == pytest.approx(
        p.detokenize_step_us * 1e-6 + 10 * p.detokenize_token_us * 1e-6
    )


def test_the_model_reads_host_terms_only_through_host_loop():
    """No module of the model reads a host-loop parameter of the profile itself, so a
    richer host-loop model changes host_loop alone."""
    terms = {"cpu_iteration_ms", "cpu_hop_ms", "frontend_ms", "detokenize_step_us", "detokenize_token_us"}
    for name in ("steady_model.py", "slot_schedule.py"):
        tree = ast.parse((SCENARIO / name).read_text())
        read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not read & terms, name

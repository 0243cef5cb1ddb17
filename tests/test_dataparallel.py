"""Data parallelism (docs/engines.md §8): the engines' routing rules, lock-step MoE
steps with dummy batches on idle ranks, independent dense replicas, dp = 1 unchanged."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import pytest
from conftest import finished, profile_for
from conftest import simulate as simulate_by_hand

import pipesim
from pipesim.engines.batches import Request
from pipesim.engines.routing import LB_REFRESH_S, LeastLoaded, RoundRobin
from pipesim.sim.dataparallel import LockStep, Replicas
from pipesim.sim.pipeline import Pipeline

QWEN_MOE = "qwen3-30b-a3b"
LLAMA = "llama-3.1-8b"


def _scenario(engine: str, model: str, rows=None, lockstep: bool | None = None, **kw):
    """A scenario of `engine` on the reference box; with `rows`, a trace of those
    (arrival_s, input, output) rows; `lockstep` overrides whether the DP ranks step
    together (the plan's `moe_spans_dp`: a MoE model's under vLLM)."""
    kw.setdefault("profile", profile_for(engine))
    if rows is None:
        sc = pipesim.build_scenario(engine=engine, model=model, **kw)
    else:
        sc = pipesim.build_scenario(
            engine=engine, model=model, rate_rps=1.0, num_requests=1, input_len=16, output_len=4, **kw
        )
        sc = replace(
            sc, workload=replace(sc.workload, kind="trace", trace=tuple(rows), num_requests=len(rows))
        )
    if lockstep is not None:
        sc = replace(sc, plan=replace(sc.plan, moe_spans_dp=lockstep))
    return sc


def _run(sc, warm: int = 0, measure: int | None = None, setup=None, ranked: bool | None = None):
    """Build and run the simulation as api.simulate does; `ranked=True` runs even one
    rank on the DP machinery."""
    n = sc.workload.num_requests if measure is None else measure
    return simulate_by_hand(sc, warm, n, setup=setup, ranked=ranked)


# ---- routing ----------------------------------------------------------------------------


def test_sglang_round_robin_in_arrival_order():
    """DataParallelController.round_robin_scheduler: ranks in turn, one counter."""
    sc = _scenario("sglang", LLAMA, dp=3, rate_rps=50.0, num_requests=10, input_len=32, output_len=4)
    sim = _run(sc)
    assert isinstance(sim.backend, Replicas) and isinstance(sim.frontend.router, RoundRobin)
    assert sim.frontend.routed == [i % 3 for i in range(10)]
    assert len(finished(sim)) == 10


class _Rank:
    def __init__(self, waiting: int = 0, running: int = 0):
        self.waiting = deque(Request(i, 0.0, 8, 8) for i in range(waiting))
        self.running = running


def test_vllm_routes_to_lowest_waiting_x4_plus_running():
    """DPLBAsyncMPClient.get_core_engine_for_request: score = waiting * 4 + running,
    the pick gets one more waiting until the coordinator's next update."""
    router = LeastLoaded(2)
    ranks = [_Rank(running=3), _Rank(waiting=1)]  # scores 3 and 4
    # 3 < 4: rank 0, now 3 + 4 = 7; then 7 > 4: rank 1, now 8; then 7 < 8: rank 0
    assert [router.route(0.0, ranks) for _ in range(3)] == [0, 1, 0]
    assert router.counts == [[2, 3], [2, 0]]


def test_vllm_tie_goes_to_first_engine_and_counts_refresh():
    """Strict < over the engines from index 0: a tie goes to the first; once the counts
    are LB_REFRESH_S old they are read afresh (here: nothing waits or runs)."""
    router, ranks = LeastLoaded(3), [_Rank(), _Rank(), _Rank()]
    assert [router.route(0.0, ranks) for _ in range(3)] == [0, 1, 2]
    assert router.counts == [[1, 0], [1, 0], [1, 0]]
    assert router.route(LB_REFRESH_S * 0.99, ranks) == 0  # not yet republished
    assert router.counts == [[2, 0], [1, 0], [1, 0]]
    assert router.route(LB_REFRESH_S, ranks) == 0 and router.counts == [[1, 0], [0, 0], [0, 0]]


def test_each_engine_hands_out_its_router():
    vllm = _scenario("vllm", LLAMA, dp=2, concurrency=1)
    sglang = _scenario("sglang", LLAMA, dp=2, concurrency=1)
    assert isinstance(vllm.settings.router(2), LeastLoaded)
    assert isinstance(sglang.settings.router(2), RoundRobin)


# ---- lock step and replicas ---------------------------------------------------------------

# B decodes alone; A's long prompt arrives later, on the other rank (the second arrival
# goes to the rank with the lower score, SGLang's round robin does the same)
A_LATE = [(0.0, 16, 60), (0.05, 1800, 2)]


def _gaps(engine, model, rows, **kw):
    """The simulation, and the gaps between request B's (rid 0) decode returns."""
    times: list = []

    def setup(sim):
        complete = sim.complete

        def logged(mb):
            out = complete(mb)
            if any(r.rid == 0 for r in mb.decode):
                times.append(sim.env.now)
            return out

        sim.complete = logged

    sim = _run(_scenario(engine, model, rows, **kw), setup=setup)
    return sim, [b - a for a, b in zip(times, times[1:])]


def test_moe_step_waits_for_the_slowest_rank():
    """vLLM DPEngineCoreProc / SGLang prepare_mlp_sync_batch: the MoE layers run in lock
    step, so the decoding rank's step lasts as long as the other rank's prefill; once A
    is done its rank runs dummy batches while B decodes."""
    sim, gaps = _gaps("vllm", QWEN_MOE, A_LATE, dp=2)
    assert isinstance(sim.backend, LockStep)
    assert sim.frontend.routed == [0, 1]
    a = sim.requests[1]
    prefill_part = sum(sim.backend.step_costs.rank_part(_prefill_shape(a)))
    assert max(gaps) >= prefill_part
    steady = sorted(gaps)[len(gaps) // 2]
    assert max(gaps) > 3 * steady
    # B's rank always had a batch; A's rank had one in two of B's ~60 steps (prefill,
    # one decode) and ran a dummy batch in the others
    assert sim.backend.dummy_steps[0] == 0
    assert sim.backend.dummy_steps[1] >= 60 - 1 - 2
    assert len(finished(sim)) == 2


def _prefill_shape(req):
    from pipesim.costs.primitives import Shape

    return Shape(0, 0, ((req.input_len, 0),), graphed=False)


def test_independent_replicas_do_not_wait():
    """A dense model's DP ranks are independent replicas (vLLM: 'Non-MoE DP ranks are
    completely independent'): A's prefill on rank 1 leaves B's decode steps alone."""
    sim, gaps = _gaps("vllm", LLAMA, A_LATE, dp=2)
    assert isinstance(sim.backend, Replicas)
    assert sim.frontend.routed == [0, 1]
    steady = sorted(gaps)[len(gaps) // 2]
    assert max(gaps) < 1.5 * steady
    assert len(finished(sim)) == 2


# ---- invariants -----------------------------------------------------------------------------

ROWS = [(0.01 * i, 40 + 37 * (i % 7), 3 + 5 * (i % 4)) for i in range(24)]


def _finish_times(sim):
    return [r.finish_s for r in sorted(sim.requests, key=lambda r: r.rid)]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("lockstep", [False, True])
def test_one_rank_is_the_plain_simulation(engine, lockstep):
    """dp = 1: the DP machinery (a rank, its routing, a lock-step step split into the
    rank's part and the MoE part) gives the plain simulation's timings."""
    plain = _run(_scenario(engine, QWEN_MOE, ROWS))
    one = _run(_scenario(engine, QWEN_MOE, ROWS, lockstep=lockstep), ranked=True)
    assert isinstance(plain.backend, Pipeline)
    assert isinstance(one.backend, LockStep if lockstep else Replicas)
    assert one.frontend.routed == [0] * len(ROWS)
    assert _finish_times(one) == pytest.approx(_finish_times(plain), rel=1e-9)


@pytest.mark.parametrize("lockstep", [False, True])
def test_every_request_completes(lockstep):
    sc = _scenario("vllm", QWEN_MOE, ROWS, dp=3, lockstep=lockstep)
    sim = _run(sc)
    assert len(finished(sim)) == len(ROWS)
    assert all(r.generated == r.output_len and r.prefilled == r.input_len for r in sim.requests)
    assert all(rank.running == 0 and rank.kv_free == sc.settings.kv_tokens for rank in sim.instances)
    assert sum(n for _, n in sim.record().tokens) == sum(o for _, _, o in ROWS)


def test_dense_replicas_double_throughput_under_ample_load():
    """Two independent replicas with twice the clients serve twice the tokens per
    second (the front end balances them by queue length)."""
    from pipesim.measure.metrics import collect

    def tok_s(dp, conc):
        sc = _scenario("vllm", LLAMA, dp=dp, concurrency=conc, input_len=128, output_len=64)
        sim = _run(sc, warm=conc, measure=6 * conc)
        return collect(sim.record(), {}, 0.0).output_throughput_tok_s

    one, two = tok_s(1, 32), tok_s(2, 64)
    assert two / one == pytest.approx(2.0, rel=0.05)


# ---- through the API ----------------------------------------------------------------------


def _sglang_dp_attention(concurrency):
    """Qwen3-30B-A3B on SGLang, TP2 x DP2 with DP attention, --max-running-requests 64."""
    return pipesim.build_scenario(
        model=QWEN_MOE,
        engine="sglang",
        tp=2,
        dp=2,
        dp_attention=True,
        concurrency=concurrency,
        max_running_requests=64,
        profile=profile_for("sglang"),
    )


def test_sglang_dp_attention_splits_the_running_cap_and_the_chunk():
    """server_args.py _handle_data_parallelism: chunked_prefill_size // dp_size with DP
    attention; --max-running-requests is split over the DP workers
    (max_running_requests // dp_size each)."""
    base = pipesim.build_scenario(
        model=QWEN_MOE, engine="sglang", tp=2, concurrency=8, profile=profile_for("sglang")
    )
    sc = _sglang_dp_attention(concurrency=8)
    assert sc.settings.max_running_requests == 32
    assert sc.settings.chunked_prefill_size == base.settings.chunked_prefill_size // 2


@pytest.mark.parametrize(
    "engine,model,kw",
    [
        ("vllm", QWEN_MOE, dict(tp=1, dp=2)),  # MoE: lock step
        ("vllm", LLAMA, dict(tp=1, dp=2)),  # dense: replicas
        ("sglang", QWEN_MOE, dict(tp=2, dp=2, dp_attention=True)),  # DP attention: lock step
        ("sglang", LLAMA, dict(tp=1, dp=2)),  # SGLang DP without DP attention: replicas
    ],
    ids=["vllm-moe", "vllm-dense", "sglang-dp-attention", "sglang-replicas"],
)
def test_predict_reports_every_rank(engine, model, kw):
    r = pipesim.predict(
        model=model,
        engine=engine,
        profile=profile_for(engine),
        conc=16,
        input_len=64,
        output_len=16,
        ci_target=None,
        **kw,
        intervals=False,
    )
    assert r.completed_requests > 0
    assert len(r.stage_busy_fraction) == 2  # one row per DP rank
    assert r.scenario["dp"] == 2


def test_dp_with_pipeline_stages_is_refused():
    with pytest.raises(pipesim.UserError, match="--pp 1 with --dp"):
        pipesim.predict(
            model=LLAMA, engine="vllm", profile=profile_for("vllm"), tp=1, pp=2, dp=2, conc=4, intervals=False
        )


def test_trace_names_dp_ranks():
    """The trace of a DP run has one GPU track per rank's GPU, named by its DP rank."""
    from pipesim.report.trace import build_trace
    from pipesim.sim.runner import simulate

    sc = pipesim.build_scenario(
        model=QWEN_MOE,
        engine="vllm",
        profile=profile_for("vllm"),
        tp=1,
        dp=2,
        concurrency=4,
        input_len=32,
        output_len=8,
    )
    rec, res = simulate(sc, ci_target=None, record="full")
    names = [
        e["args"]["name"] for e in build_trace(rec, res)["traceEvents"] if e.get("name") == "thread_name"
    ]
    assert any(n.startswith("GPU 0: DP rank 0") for n in names)
    assert any(n.startswith("GPU 1: DP rank 1") for n in names)


# ---- sweeps and search ----------------------------------------------------------------------


def test_dp_splits_of():
    """dp ranks of pp 1: tp = gpus / dp (replicas, vLLM), tp = gpus with DP attention."""
    from pipesim.explore.grid import dp_splits_of

    assert dp_splits_of(8, 1, False) == [(8, 1, 1), (4, 2, 1), (2, 4, 1), (1, 8, 1)]
    assert dp_splits_of(8, 2, False) == [(4, 1, 2)]
    assert dp_splits_of(8, 4, True) == [(8, 1, 4)]
    assert dp_splits_of(6, 4, False) == []


def test_sweep_includes_dp_splits():
    from pipesim.explore.sweep import summary, sweep

    df = sweep(
        gpus=2, dp=[1, 2], conc=[4], model=QWEN_MOE, engine="vllm", input_len=64, output_len=16, workers=1
    )
    dp2 = df[df.dp == 2]
    assert list(dp2.split) == ["TP1 x PP1 x DP2"] and list(dp2.gpus) == [2] and list(dp2.tp) == [1]
    assert set(df[df.dp == 1].split) == {"TP2 x PP1", "TP1 x PP2"}
    assert "TP1 x PP1 x DP2" in summary(df)


def test_sweep_dp_attention_splits_share_tp_with_the_plain_split():
    """SGLang TP2 and TP2 with DP attention have the same tp, pp and GPUs: told apart by dp."""
    from pipesim.explore.search import search
    from pipesim.explore.sweep import summary, sweep

    kw = dict(
        gpus=2, dp=[1, 2], dp_attention=True, model=QWEN_MOE, engine="sglang", input_len=64, output_len=16
    )
    df = sweep(conc=[4, 16], workers=1, **kw)
    both = df[(df.tp == 2) & (df.conc == 4)]
    assert sorted(both.split) == ["TP2 x PP1", "TP2 x PP1 x DP2-attn"]
    assert both.gpus.tolist() == [2, 2]
    text = summary(df)
    assert "TP2 x PP1 x DP2-attn" in text and "TP2 x PP1 " in text
    ranked = search(2, "throughput", table=df).ranked
    assert len(ranked) == 3  # TP1 x PP2, TP2 x PP1, TP2 x PP1 x DP2-attn: one row each


def test_cli_sweep_dp_flag(capsys):
    from pipesim.cli import main

    args = ["sweep", "--gpus", "2", "--dp", "1,2", "--model", QWEN_MOE, "--engine", "vllm", "--conc", "4"]
    try:
        main([*args, "--input-len", "64", "--output-len", "16", "--workers", "1"])
    except SystemExit as e:
        assert e.code in (0, None)
    assert "TP1 x PP1 x DP2" in capsys.readouterr().out


def test_sweep_caps_count_every_rank():
    """Each DP rank has its own running cap and KV pool: the sweep's bounds are dp times a rank's."""
    from pipesim.explore.sweep import sweep

    kw = dict(gpus=2, conc=[4], model=LLAMA, engine="vllm", input_len=64, output_len=16, workers=1)
    row = sweep(dp=[2], max_num_seqs=100, **kw).iloc[0]
    assert row.running_cap == 200
    assert row.kv_request_cap == 2 * (row.kv_cache_tokens // (64 + 16))


def test_a_dp_engine_admits_every_ranks_running_cap():
    """Each DP rank runs its own scheduler with its own cap and KV pool (docs/engines.md
    §8): the requests running at once are dp x one rank's cap, so a closed loop of
    2 x 32 clients is not queued behind one rank's 32."""
    from pipesim.sim.runner import admitted_concurrency

    sc = _sglang_dp_attention(concurrency=64)
    assert sc.settings.max_running_requests == 32
    per_request = sc.workload.input_len.mean + sc.workload.output_len.mean
    assert sc.settings.kv_tokens // per_request >= 32  # the KV pool is not the bound here
    assert admitted_concurrency(sc) == 64
    assert admitted_concurrency(replace(sc, workload=replace(sc.workload, concurrency=200))) == 64

"""Engine timing rules (docs/engines.md): CUDA-graph padding, the front end and the
closed-loop client, every PP rank's CPU loop, and the async batch depth."""

import pytest
from conftest import fast_run, finished, no_host_loop, record_launches, simulate

import pipesim
from pipesim.engines.graphs import padded_size, vllm_capture_sizes
from pipesim.engines.graphs import sglang_capture_sizes as capture_sizes

# ---- §5 CUDA graphs ----------------------------------------------------------------


def test_sglang_capture_sizes_follow_server_args():
    # server_args.py _generate_cuda_graph_batch_sizes: [1,2,4,8,12] + range(16,257,8) + range(272,512,16) + ...
    sizes = capture_sizes(512)
    assert sizes[:7] == (1, 2, 4, 8, 12, 16, 24)
    assert 256 in sizes and 264 not in sizes and 272 in sizes and 288 in sizes and sizes[-1] == 512
    assert capture_sizes(160)[-1] == 160 and capture_sizes(80)[-1] == 80


def test_padding_is_to_the_next_captured_size():
    # CudaGraphRunner.replay: bisect_left over capture_bs
    sizes = capture_sizes(256)
    assert [padded_size(sizes, n) for n in (1, 3, 5, 9, 13, 17, 250, 256, 257)] == [
        1,
        4,
        8,
        12,
        16,
        24,
        256,
        256,
        0,
    ]


def test_vllm_capture_sizes_follow_vllm_config():
    # vllm/config/vllm.py _set_cudagraph_sizes: [1,2,4] + range(8,256,8) + range(256, max+1, 16),
    # max = min(max_num_seqs * 2, 512), capped at max_num_batched_tokens
    assert len(vllm_capture_sizes(1024, 8192)) == 3 + 31 + 17
    assert vllm_capture_sizes(128, 2048)[-1] == 256
    assert vllm_capture_sizes(16, 8192)[-1] == 32


def test_a_graphed_decode_batch_costs_its_padded_size(profile):
    sc = pipesim.build_scenario(tp=8, pp=1, concurrency=13, output_len="4", profile=profile)
    st = sc.settings
    assert st.graph_tokens(13, 0) == 16 and st.graph_tokens(13, 100) == 0  # prefill runs eagerly
    log = []
    sim = simulate(sc, 13, 13, setup=lambda s: log.append(record_launches(s)))
    shapes = [mb.shape for *_, mb in log[0] if mb.decode]
    assert shapes and all(
        sh.decode == padded_size(capture_sizes(st.cuda_graph_max_bs), len(mb.decode))
        for sh, (*_, mb) in zip(shapes, [e for e in log[0] if e[4].decode])
    )
    assert sim.completed >= 13


def test_disabled_graphs_do_not_pad(profile):
    sc = pipesim.build_scenario(tp=8, pp=1, concurrency=13, disable_cuda_graph=True, profile=profile)
    assert sc.settings.graph_tokens(13, 0) == 0


# ---- §1 front end and client loop ---------------------------------------------------


def test_closed_loop_client_waits_for_the_output_path_and_the_front_end(profile):
    # bench_serving: the next request is sent once the response has arrived; the
    # detokenizer handles a returned step in detokenize_step_us + detokenize_token_us per token,
    # then the front end takes frontend_ms before the scheduler sees it
    prof = no_host_loop(profile, frontend_ms=3.0, detokenize_step_us=500.0, detokenize_token_us=100.0)
    sc = pipesim.build_scenario(tp=8, pp=1, concurrency=1, output_len="5", profile=prof)
    enq = {}
    sim = simulate(sc, 2, 3, setup=lambda s: _record_enqueue(s, enq))
    reqs = sorted(finished(sim), key=lambda r: r.rid)
    returns = [t for t, _ in sim.rec.tokens]  # the engine's returns (a full record keeps them)
    for prev, nxt in zip(reqs, reqs[1:]):
        # the client sees its last token once the detokenizer has handled the step that
        # finished it, one request: 500 us + 1 x 100 us after the engine returned it
        assert any(prev.finish_s == pytest.approx(t + 600e-6, abs=1e-9) for t in returns)
        assert nxt.arrival_s == pytest.approx(prev.finish_s, abs=1e-9)
        assert enq[nxt.rid] == pytest.approx(nxt.arrival_s + 3e-3, abs=1e-9)


def _record_enqueue(sim, enq):
    orig = sim.frontend.enqueue

    def enqueue(req):
        enq[req.rid] = sim.env.now
        orig(req)

    sim.frontend.enqueue = enqueue


def test_front_end_serves_one_request_at_a_time(profile):
    prof = no_host_loop(profile, frontend_ms=2.0)
    sc = pipesim.build_scenario(tp=8, pp=1, concurrency=8, output_len="4", profile=prof)
    enq = {}
    simulate(sc, 8, 8, setup=lambda s: _record_enqueue(s, enq))
    first = sorted(enq[r] for r in range(8))
    assert first == pytest.approx([2e-3 * (i + 1) for i in range(8)], abs=1e-9)


# ---- §2 every PP rank runs the loop -------------------------------------------------


def _llama_tp2_pp4(profile, input_len="64", **kw):
    """Llama-3.1-8B on TP2 x PP4 under `profile` (64-token prompts unless told)."""
    return pipesim.build_scenario(
        tp=2, pp=4, model="llama-3.1-8b", input_len=input_len, profile=profile, **kw
    )


def test_every_rank_spends_cpu_per_slot_iteration(profile):
    # event_loop_pp runs on every rank: a rank cannot launch two batches less than one
    # iteration's CPU apart, nor more batches than its slot iterations allow
    cpu_ms = 30.0  # far above a stage's compute: the ranks are CPU-bound
    prof = no_host_loop(profile, cpu_iteration_ms=cpu_ms)
    sc = _llama_tp2_pp4(prof, concurrency=8, output_len="20", pp_max_micro_batch_size=2)
    sim = simulate(sc, 8, 8)
    rec = sim.record()
    for s in range(1, 4):
        starts = [t0 for t0, _ in rec.compute[s]]
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert min(gaps) >= cpu_ms * 1e-3 - 1e-9


def test_rank_cpu_waits_for_the_previous_rank(profile):
    # the metadata of a slot's batch leaves rank r-1 when its CPU launched it; rank r
    # launches after that plus the pickled relay (cpu_hop_ms) and its own iteration
    prof = no_host_loop(profile, cpu_iteration_ms=5.0, cpu_hop_ms=2.0)
    sc = _llama_tp2_pp4(prof, concurrency=4, output_len="6", pp_max_micro_batch_size=1)
    rec = simulate(sc, 4, 4).record()
    first = [rec.compute[s][0][0] for s in range(4)]
    for s in range(1, 4):
        assert first[s] >= first[s - 1] + (2.0 + 5.0) * 1e-3 - 1e-9


# ---- §3 async batch depth -------------------------------------------------------------


def _pp_run(profile, depth, cpu_ms, conc):
    # the CPU's only cost is `cpu_ms` per slot iteration: the profile's measured relay,
    # front end and output path (docs/engines.md §1) are set to 0 here so that "no CPU
    # time" means none
    prof = no_host_loop(
        profile,
        cpu_iteration_ms=cpu_ms,
        cpu_hop_ms=0.0,
        frontend_ms=0.0,
        detokenize_step_us=0.0,
        detokenize_token_us=0.0,
    )
    sc = _llama_tp2_pp4(
        prof,
        concurrency=conc,
        input_len="128",
        output_len="60",
        pp_max_micro_batch_size=4,
        pp_async_batch_depth=depth,
    )
    return fast_run(sc, warmup_requests=conc, measure_requests=3 * conc)


def test_depth_changes_nothing_without_cpu_time(profile):
    # 16 clients, cap 4: four full slots at depth 0 and at depth 4 (four of eight
    # slots); with no CPU time the extra empty iterations cost nothing
    a, b = _pp_run(profile, 0, 0.0, 16), _pp_run(profile, 4, 0.0, 16)
    assert b.output_throughput_tok_s == pytest.approx(a.output_throughput_tok_s, rel=1e-6)


def test_depth_changes_results_with_cpu_time(profile):
    # the same four full slots, 2 ms of CPU per iteration: depth 4 runs eight slot
    # iterations per round on every rank (four empty), depth 0 four
    a, b = _pp_run(profile, 0, 2.0, 16), _pp_run(profile, 4, 2.0, 16)
    assert b.output_throughput_tok_s < 0.9 * a.output_throughput_tok_s


def test_full_extra_slots_hide_the_cpu(profile):
    # with every slot full (depth 4: 8 slots, 32 clients) batches queue ahead of the GPUs
    # while rank 0 processes and schedules: the CPU costs less throughput than at depth 0
    loss = {}
    for depth, conc in ((0, 16), (4, 32)):
        free, busy = _pp_run(profile, depth, 0.0, conc), _pp_run(profile, depth, 2.0, conc)
        loss[depth] = 1 - busy.output_throughput_tok_s / free.output_throughput_tok_s
    assert loss[0] > 0.1 and loss[4] < loss[0] / 2

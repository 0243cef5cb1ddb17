"""vLLM V1 async scheduling and batches in flight (docs/engines.md §6).

vllm/config/vllm.py: `async_scheduling=None` means on unless an option is incompatible
(PR #27614); `max_concurrent_batches` is 2 at pp 1 with async, pp + 1 on the V2 runner
with PP, else pp. vllm/v1/core/sched/async_scheduler.py schedules a request in flight
again with a placeholder token, so step n+1 is formed while step n computes."""

from conftest import fast_run

import pipesim

VLLM = "rtx-pro-6000-vllm"


def _sc(pp=1, **kw):
    kw.setdefault("concurrency", 16)
    return pipesim.build_scenario(
        tp=8 // pp if pp < 8 else 1,
        pp=pp,
        engine="vllm",
        model="llama-3.1-8b",
        input_len="128",
        output_len="40",
        profile=VLLM,
        **kw,
    )


def test_async_default_on_without_pp_off_with_pp():
    assert _sc(1).settings.async_scheduling and _sc(1).settings.max_concurrent_batches == 2
    assert not _sc(4).settings.async_scheduling and _sc(4).settings.max_concurrent_batches == 4
    assert _sc(4, async_scheduling=True).settings.max_concurrent_batches == 5
    assert _sc(1).knob_sources["async_scheduling"] == "engine default"


def test_async_at_pp1_has_no_half_batches():
    # placeholders: every running request is in the next step too, not split over two batches
    r = fast_run(_sc(1), warmup_requests=16, measure_requests=32)
    assert r.decode_batch_per_slot[0] > 0.9 * 16


def test_async_hides_the_cpu_per_step():
    from pipesim.profiles.profile import load_profile

    prof = load_profile(VLLM).with_params(cpu_iteration_ms=2.0)
    rates = {}
    for on in (False, True):
        for p in (load_profile(VLLM).with_params(cpu_iteration_ms=0.0), prof):
            sc = pipesim.build_scenario(
                tp=8,
                pp=1,
                engine="vllm",
                model="llama-3.1-8b",
                concurrency=16,
                input_len="128",
                output_len="40",
                profile=p,
                async_scheduling=on,
            )
            rates[(on, p.params.cpu_iteration_ms)] = fast_run(
                sc, warmup_requests=16, measure_requests=32
            ).output_throughput_tok_s
    sync_loss = 1 - rates[(False, 2.0)] / rates[(False, 0.0)]
    async_loss = 1 - rates[(True, 2.0)] / rates[(True, 0.0)]
    assert sync_loss > 0.1 and async_loss < sync_loss / 2


def test_enforce_eager_captures_no_graph():
    st = _sc(1, enforce_eager=True).settings
    assert st.graph_tokens(16, 0) == 0 and not st.graphed(16, 0)
    assert _sc(1).settings.graph_tokens(13, 0) == 16

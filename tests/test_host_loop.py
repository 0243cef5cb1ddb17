"""The host loop in the simulation: each engine release's rule against step times worked
by hand from the rule (docs/host-loop.md §6.2) and the defaults (pipesim/data/
host_loop.toml), the output path's cap, the CPU shares, and the release as an input.

A steady decode step of B requests is read off the GPU's rows: the spacing of two
consecutive decode batches' starts on the stage. The GPU part of a step is the recorded
stage interval (the cost model's, tested elsewhere); the host part is worked here."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

import pipesim
from pipesim import api
from pipesim.cli import main
from pipesim.costs.host import out_token_cap_tok_s

F = 1.68  # default host_cpu_factor
B = 16
LLAMA = dict(model="llama-3.1-8b", box="h100-sxm-8x", tp=1, input_len=32, output_len=300)
RUN = dict(warmup_requests=B, measure_requests=B, ci_target=None, record="full")


def us(x: float, factor: float = F) -> float:
    return x * factor * 1e-6


def v1_cpu(b: int = B, factor: float = F) -> float:
    """vLLM V1 (0.8 on): sched (15 + 7.87 B) + prep (100 + 1 B), host_loop.toml."""
    return us(15 + 7.87 * b + 100 + b, factor)


def v0_cpu(b: int = B) -> float:
    """vLLM V0: sched (28 + 12.37 B) + prep (100 + 1 B); no broadcast at TP1."""
    return us(28 + 12.37 * b + 100 + b)


def v0_out(b: int = B, per_req: float = 24.0) -> float:
    return us(24 + per_req * b)


def sglang_cpu(b: int = B, factor: float = F) -> float:
    """SGLang: sched (64 + 6.57 B) + prep (100 + 1 B)."""
    return us(64 + 6.57 * b + 100 + b, factor)


def steady(factor: float | None = None, **kw):
    """(spacings of consecutive full decode batches' starts, their stages' busy stretches)."""
    sc = pipesim.build_scenario(concurrency=B, **{**LLAMA, **kw})
    if factor is not None:
        sc = replace(sc, profile=sc.profile.with_params(host_cpu_factor=factor))
    rec, _ = api.simulate(sc, **RUN)
    # a stage's busy stretch per batch: its compute, then its TP collectives (if any); the
    # last launched may lie past the stop
    ends = [e for _, e in rec.comm[0]] if sc.plan.tp > 1 else [e for _, e in rec.compute[0]]
    rows = list(zip(rec.batches, [(s, e) for (s, _), e in zip(rec.compute[0], ends)]))
    gaps, lengths = [], []
    for (b0, (s0, e0)), (b1, (s1, _)) in zip(rows, rows[1:]):
        if b0.kind == b1.kind == "decode" and b0.requests == b1.requests == B:
            gaps.append(s1 - s0)
            lengths.append(e0 - s0)
    assert len(gaps) > 50
    return gaps[10:-10], lengths[10:-10]


def check(gaps, lengths, expect):
    for gap, gpu in zip(gaps, lengths):
        assert gap == pytest.approx(expect(gpu), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("factor", [F, 60.0])
def test_vllm_v1_without_async_scheduling_runs_its_cpu_in_series(factor):
    """v0.13: step = sched(B) + prep(B) + max(gpu, launch); a graphed decode batch
    launches nothing from v0.11 (full graphs)."""
    gaps, lengths = steady(factor, engine="vllm", engine_version="0.13.0")
    check(gaps, lengths, lambda gpu: v1_cpu(factor=factor) + gpu)


@pytest.mark.parametrize("factor", [F, 60.0])
def test_vllm_v1_async_scheduling_hides_its_cpu_under_the_gpu(factor):
    """v0.14 (async by default at pp 1): step = max(gpu, sched(B) + prep(B))."""
    gaps, lengths = steady(factor, engine="vllm", engine_version="0.14.0")
    check(gaps, lengths, lambda gpu: max(gpu, v1_cpu(factor=factor)))
    assert factor == F or all(g == pytest.approx(v1_cpu(factor=factor)) for g in gaps)  # CPU-bound


def test_vllm_v1_eager_launches_on_the_engine_core_thread_at_tp1():
    """--enforce-eager, TP1, GPU made negligible (kernel-scale 0.001): the stage waits for
    the launch of 32 layers x 10 kernels + 10 outside them at 14.9 us x 1.68 each;
    in series with sched + prep without async scheduling, and still in series with
    it, since the same thread launches (max(gpu, sched + prep + launch))."""
    launch = us((32 * 10 + 10) * 14.9)
    for version in ("0.13.0", "0.14.0"):
        gaps, lengths = steady(engine="vllm", engine_version=version, enforce_eager=True, kernel_scale=0.001)
        assert all(g == pytest.approx(launch) for g in lengths)
        check(gaps, lengths, lambda gpu: v1_cpu() + launch)


def test_vllm_v1_piecewise_graphs_launch_attention_between_the_pieces():
    """v0.10 (piecewise CUDA graphs): a graphed decode batch still launches 2 kernels per
    layer, 32 x 2 x 14.9 us x 1.68, on the engine core's thread at TP1."""
    gaps, lengths = steady(engine="vllm", engine_version="0.10.1.1", kernel_scale=0.001)
    launch = us(32 * 2 * 14.9)
    check(gaps, lengths, lambda gpu: v1_cpu() + max(gpu, launch))


def test_vllm_v0_async_output_processing_runs_under_the_next_step():
    """v0.6.3: step = sched + prep + max(gpu, out_step(B)) with the async output
    processor; + gpu + out_step without it; v0.5.3 (no processor, the API server's chunk
    in the engine's process): + out_step at 24 + 33.9 B."""
    gaps, lengths = steady(engine="vllm", engine_version="0.6.3.post1")
    check(gaps, lengths, lambda gpu: v0_cpu() + max(gpu, v0_out()))
    gaps, lengths = steady(engine="vllm", engine_version="0.6.3.post1", disable_async_output_proc=True)
    check(gaps, lengths, lambda gpu: v0_cpu() + gpu + v0_out())
    gaps, lengths = steady(engine="vllm", engine_version="0.5.3.post1")
    check(gaps, lengths, lambda gpu: v0_cpu() + gpu + v0_out(per_req=33.9))


def test_vllm_v0_multi_step_pays_the_schedule_once_per_n_steps():
    gaps, lengths = steady(engine="vllm", engine_version="0.6.3.post1", num_scheduler_steps=4)
    check(gaps, lengths, lambda gpu: v0_cpu() / 4 + max(gpu, v0_out()))


@pytest.mark.parametrize("factor", [F, 60.0])
def test_sglang_overlap_hides_its_cpu_and_without_it_pays_it(factor):
    """SGLang 0.5.2: max(gpu, sched + prep) with the overlap scheduler; sched + prep + gpu
    with --disable-overlap-schedule and in 0.3.5 (opt-in then)."""
    gaps, lengths = steady(factor, engine="sglang", engine_version="0.5.2")
    check(gaps, lengths, lambda gpu: max(gpu, sglang_cpu(factor=factor)))
    for kw in (dict(engine_version="0.5.2", disable_overlap_schedule=True), dict(engine_version="0.3.5")):
        gaps, lengths = steady(factor, engine="sglang", **kw)
        check(gaps, lengths, lambda gpu: sglang_cpu(factor=factor) + gpu)


def test_sglang_tp_ranks_pay_the_cpu_group_broadcast_every_iteration():
    """TP2 without overlap: + (75 + 16.5 x 1) us x 1.68 per iteration (§5.6)."""
    gaps, lengths = steady(engine="sglang", engine_version="0.5.2", disable_overlap_schedule=True, tp=2)
    check(gaps, lengths, lambda gpu: sglang_cpu() + us(75 + 16.5) + gpu)


def _small_context_model(tmp_path: Path) -> str:
    cfg = json.loads(
        Path(pipesim.__file__).with_name("data").joinpath("models", "llama-3.1-8b.json").read_text()
    )
    cfg["max_position_embeddings"] = 8192
    out = tmp_path / "config.json"
    out.write_text(json.dumps(cfg))
    return str(out)


def test_vllm_v0_without_chunked_prefill_runs_a_new_prompt_alone(tmp_path):
    """Below 32K context V0 does not chunk by default: a step that admits a prompt holds
    no decode (the running ones wait); V1 mixes them; above 32K V0 chunks (512 tokens)."""
    model = _small_context_model(tmp_path)
    for version, mixed in (("0.6.3.post1", False), ("0.13.0", True)):
        sc = pipesim.build_scenario(
            concurrency=8,
            engine="vllm",
            engine_version=version,
            **{**LLAMA, "model": model, "output_len": 40},
        )
        rec, _ = api.simulate(sc, warmup_requests=8, measure_requests=24, ci_target=None, record="full")
        kinds = {b.kind for b in rec.batches}
        assert ("mixed" in kinds) is mixed and "decode" in kinds
        assert sc.settings.chunked_prefill is mixed
    v0_long = pipesim.build_scenario(concurrency=8, engine="vllm", engine_version="0.6.3.post1", **LLAMA)
    assert v0_long.settings.chunked_prefill and v0_long.settings.max_num_batched_tokens == 512


def test_the_output_path_caps_output_throughput():
    """SGLang's detokenizer at 1 ms per token (factor 1.68): at most 1 / 1.68 ms = 595 tok/s,
    however fast the GPU, and a closed loop settles just under it."""
    sc = pipesim.build_scenario(concurrency=64, engine="sglang", **{**LLAMA, "output_len": 100})
    prof = sc.profile.with_params(detokenize_token_us=1000.0, detokenize_step_us=0.0, stream_token_us=0.0)
    cap = out_token_cap_tok_s(prof.params)
    assert cap == pytest.approx(1 / 1.68e-3)
    r = api.run(replace(sc, profile=prof))
    assert 0.9 * cap <= r.output_throughput_tok_s <= cap * 1.001
    assert r.host_processes["detokenizer"] > 0.9


@pytest.mark.parametrize(
    "kw",
    [
        dict(engine="vllm", engine_version="0.6.3.post1", tp=2),
        dict(engine="vllm", engine_version="0.19.0", enforce_eager=True),
        dict(engine="sglang", engine_version="0.5.2", pp=2),
        dict(engine="sglang", engine_version="0.5.2", dp=2),
        dict(engine="vllm", engine_version="0.8.0", pp=2),  # V0 under PP: virtual engines
    ],
)
def test_cpu_share_is_a_share_and_its_parts_sum_to_it(kw):
    r = pipesim.predict(conc=32, **{**LLAMA, "output_len": 60, **kw})
    assert 0 < r.cpu_share <= 1
    assert sum(r.cpu_parts.values()) == pytest.approx(r.cpu_share)
    assert all(0 <= v <= 1 for v in r.host_processes.values()) and r.host_processes["front_end"] > 0


def test_the_release_selects_the_rules():
    def settings(engine, version, **kw):
        return pipesim.build_scenario(
            concurrency=1, engine=engine, engine_version=version, **{**LLAMA, **kw}
        ).settings

    assert settings("vllm", "0.6.3.post1").host.generation == "V0"
    assert settings("vllm", "0.6.3.post1").host.async_output
    assert not settings(
        "vllm", "0.6.3.post1", enforce_eager=True
    ).host.async_output  # verify_async_output_proc
    assert not settings("vllm", "0.5.3.post1").host.async_output  # before v0.6.0
    v0_pp = settings("vllm", "0.8.0", pp=2, tp=1)
    assert v0_pp.host.generation == "V0" and v0_pp.running_cap == 2 * 256  # max_num_seqs per virtual engine
    assert settings("vllm", "0.9.2", pp=2).host.generation == "V1"
    assert not settings("vllm", "0.13.0").async_scheduling and settings("vllm", "0.14.0").async_scheduling
    assert settings("vllm", "0.6.3.post1").enable_prefix_caching is False
    assert settings("vllm", "0.13.0").enable_prefix_caching is True
    assert settings("sglang", "0.3.5").host.why == "opt-in before 0.3.6"
    assert settings("sglang", "0.3.6").host.overlap
    assert not settings("sglang", "0.5.2", pp=2).host.overlap


def test_the_release_defaults_to_the_profile_s_and_is_reported():
    r = pipesim.predict(conc=1, engine="vllm", engine_version="0.6.3.post1", **{**LLAMA, "output_len": 8})
    assert (
        r.scenario["engine_version"] == "0.6.3.post1" and r.scenario["engine"]["host"]["generation"] == "V0"
    )
    assert r.to_dict()["cpu_parts"]["output_step"] > 0
    sc = pipesim.build_scenario(
        concurrency=1, profile="rtx-pro-6000-vllm", model="llama-3.1-8b", output_len=8
    )
    assert sc.engine_version == "0.19.0"  # the profile's


def test_unknown_releases_are_one_line(capsys):
    for args in (
        ["--engine", "vllm", "--engine-version", "0.4.2"],
        ["--engine-version", "0.7.0"],  # the default profile's engine is SGLang
        ["--engine", "vllm", "--engine-version", "0.9.2", "--async-scheduling"],
        ["--engine", "vllm", "--engine-version", "0.13.0", "--num-scheduler-steps", "4"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(["predict", "--conc", "1", "--model", "llama-3.1-8b", "--output-len", "4", *args])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and len(err.splitlines()) == 1 and "--" in err

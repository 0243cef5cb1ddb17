"""Knob resolution tells where each value came from (docs/engines.md §7).

SGLang's `Scheduler.__init__` (python/sglang/srt/managers/scheduler.py) derives
`pp_max_micro_batch_size = max(max_running_requests // pp_size, 1)` when the flag is
not given, so a profile's deployment cap must not survive a user's own
`--max-running-requests`."""

import json

import pytest

import pipesim
from pipesim.base.files import read_table
from pipesim.cli import main
from pipesim.inputs.box import load_box
from pipesim.profiles.profile import load_profile
from pipesim.report.table import table

DEPLOYMENT = (
    "rtx-pro-6000-sglang-deployment"  # launched with --max-running-requests 64 --pp-max-micro-batch-size 64
)


def test_profile_deployment_flags_stand_in_for_knobs_not_given():
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=64, profile=DEPLOYMENT)
    assert sc.settings.max_running_requests == 64 and sc.settings.pp_max_micro_batch_size == 64
    assert sc.knob_sources["max_running_requests"] == "profile deployment"
    assert sc.knob_sources["pp_max_micro_batch_size"] == "profile deployment"
    assert sc.knob_sources["chunked_prefill_size"] == "engine default"


def test_mrr_alone_rederives_the_cap_as_sglang_does():
    # the README's pathology example: --max-running-requests 64 at PP8 -> 64 // 8 = 8 per slot
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=64, max_running_requests=64, profile=DEPLOYMENT)
    assert sc.settings.pp_max_micro_batch_size == 8
    assert sc.knob_sources["max_running_requests"] == "user"
    assert sc.knob_sources["pp_max_micro_batch_size"] == "engine default"
    # other deployment flags still apply
    assert sc.knob_sources["pp_async_batch_depth"] == "profile deployment"


def test_both_given_are_the_users():
    sc = pipesim.build_scenario(
        tp=1, pp=8, concurrency=64, max_running_requests=64, pp_max_micro_batch_size=16, profile=DEPLOYMENT
    )
    assert sc.settings.pp_max_micro_batch_size == 16
    assert sc.knob_sources["pp_max_micro_batch_size"] == "user"


def test_other_engine_takes_no_deployment_flag():
    # an SGLang deployment's flags are not vLLM's (the profile is refused unless borrowed)
    sc = pipesim.build_scenario(
        tp=2, pp=4, concurrency=8, engine="vllm", profile=DEPLOYMENT, allow_foreign_profile=True
    )
    assert set(sc.knob_sources.values()) == {"engine default"}


def test_sources_in_json_and_table():
    r = pipesim.predict(
        tp=1,
        pp=8,
        conc=4,
        max_running_requests=64,
        profile=DEPLOYMENT,
        output_len="8",
        warmup_requests=4,
        measure_requests=4,
        intervals=False,
    )
    assert r.to_dict()["scenario"]["knob_sources"]["pp_max_micro_batch_size"] == "engine default"
    line = table(r).splitlines()[2]
    assert "max_running_requests 64 [user]" in line and "per-slot cap 8 [default]" in line


# ---- the memory knobs on the command line --------------------------------------------------
# SGLang --mem-fraction-static (server_args.py `mem_fraction_static`) and vLLM
# --gpu-memory-utilization (vllm/config/cache.py, default 0.9): the KV pool is
# memory x fraction - weights on each GPU (docs/engines.md §4), so two fractions' pools
# differ by (f1 - f2) x GPU memory / KV bytes per token, whatever the weights.
# llama-3.1-8b (its config.json): 32 layers x 2 (K, V) x 8 KV heads x 128 head dim x 2 bytes
LLAMA_8B_KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2
LLAMA = ["--model", "llama-3.1-8b", "--conc", "1", "--input-len", "16", "--output-len", "8"]


def _predict_json(capsys, *args: str) -> dict:
    main(["predict", *LLAMA, "--json", "--no-intervals", *args])
    return json.loads(capsys.readouterr().out)["scenario"]


def _gpu_bytes(engine: str) -> float:
    box = load_profile(DEPLOYMENT if engine == "sglang" else "rtx-pro-6000-vllm").box
    return load_box(box).gpu.memory_bytes


def _fraction_of(engine: str) -> float:
    """The memory an engine's fraction is of, on one GPU: SGLang measures it after its CUDA
    context is made (1.15 GiB, engines/reserve.py CONTEXT_BYTES), vLLM takes the whole GPU."""
    return _gpu_bytes(engine) - (1.15 * 2**30 if engine == "sglang" else 0.0)


@pytest.mark.parametrize(
    "engine, flag, knob",
    [
        ("sglang", "--mem-fraction-static", "mem_fraction_static"),
        ("vllm", "--gpu-memory-utilization", "gpu_memory_utilization"),
    ],
)
def test_memory_flag_sizes_the_kv_pool(capsys, engine, flag, knob):
    hi = _predict_json(capsys, "--engine", engine, flag, "0.6")
    lo = _predict_json(capsys, "--engine", engine, flag, "0.4")
    assert hi["engine"][knob] == 0.6 and lo["engine"][knob] == 0.4
    assert hi["knob_sources"][knob] == lo["knob_sources"][knob] == "user"
    # SGLang's fraction is of the memory free after its CUDA context (one GPU: no
    # communicators), vLLM's of the whole GPU (engines/reserve.py): 0.2 more of it is KV
    expected = 0.2 * _fraction_of(engine) / LLAMA_8B_KV_BYTES_PER_TOKEN
    assert abs((hi["kv_cache_tokens"] - lo["kv_cache_tokens"]) - expected) <= 1  # two floors


def test_memory_flag_not_given_is_the_engines_default(capsys):
    sc = _predict_json(capsys, "--engine", "vllm")
    assert sc["engine"]["gpu_memory_utilization"] == 0.9  # vllm/config/cache.py
    assert sc["knob_sources"]["gpu_memory_utilization"] == "engine default"
    assert _predict_json(capsys)["knob_sources"]["mem_fraction_static"] == "engine default"


def test_memory_flag_in_the_table_line(capsys):
    main(["predict", *LLAMA, "--no-intervals", "--mem-fraction-static", "0.5"])
    assert "mem_fraction_static 0.5 [user]" in capsys.readouterr().out.splitlines()[2]
    main(["predict", *LLAMA, "--no-intervals", "--engine", "vllm"])
    assert "gpu_memory_utilization 0.9 [default]" in capsys.readouterr().out.splitlines()[2]


def test_sweep_passes_the_memory_flag(tmp_path, capsys):
    kv = []
    for f in ("0.6", "0.4"):
        out = tmp_path / f"r{f}.csv"
        main(
            ["sweep", "--gpus", "1", *LLAMA, "--workers", "1", "--out", str(out), "--mem-fraction-static", f]
        )
        kv.append(int(read_table(out).kv_cache_tokens.iloc[0]))
    capsys.readouterr()
    assert abs((kv[0] - kv[1]) - 0.2 * _fraction_of("sglang") / LLAMA_8B_KV_BYTES_PER_TOKEN) <= 1


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--mem-fraction-static", "0.5", "--engine", "vllm"], "mem_fraction_static is not a vllm knob"),
        (["--gpu-memory-utilization", "0.5"], "gpu_memory_utilization is not a sglang knob"),
        (["--mem-fraction-static", "0"], "--mem-fraction-static must be a number in (0, 1), got 0.0"),
        (["--mem-fraction-static", "1"], "--mem-fraction-static must be a number in (0, 1), got 1.0"),
        (["--mem-fraction-static", "nan"], "--mem-fraction-static must be a number in (0, 1), got nan"),
        (
            ["--engine", "vllm", "--gpu-memory-utilization", "1.5"],
            "--gpu-memory-utilization must be a number in (0, 1), got 1.5",
        ),
        (["--engine", "vllm", "--gpu-memory-utilization", "-0.1"], "must be a number in (0, 1), got -0.1"),
        (["--mem-fraction-static", "half"], "'--mem-fraction-static': 'half' is not a valid float"),
    ],
)
@pytest.mark.parametrize("command", ["predict", "trace", "sweep", "search"])
def test_memory_flag_refused_in_one_line(tmp_path, capsys, command, args, needle):
    extra = {
        "trace": ["--out", str(tmp_path / "t.json")],
        "sweep": ["--gpus", "1", "--out", str(tmp_path / "r.csv")],
    }
    with pytest.raises(SystemExit) as exc:
        main([command, *LLAMA, *extra.get(command, ["--gpus", "1"] if command == "search" else []), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error:") and err.count("\n") == 1 and needle in err, err


def test_a_fraction_too_small_for_the_weights_is_the_memory_error(capsys):
    # Kimi K2.6 at PP8: the last stage holds 8 layers + lm_head, 75.3 GiB (docs/bad-input.md)
    with pytest.raises(SystemExit) as exc:
        main(["predict", "--tp", "1", "--pp", "8", "--conc", "1", "--mem-fraction-static", "0.7"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit at tp=1 pp=8" in err and "(fraction 0.7)" in err

"""Shared fixtures and helpers for the pipesim test suite.

Expected values in the tests come from docs/physics.md, from the raw measured tables in
../shared/reference-data, from the box TOML, or from formulas worked out by hand in
the test; never from the simulator's own output.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import pipesim
from pipesim.costs.stage import CostModel
from pipesim.inputs.model import load_model
from pipesim.profiles.profile import load_profile
from pipesim.sim.simulation import Simulation

# the session's own cache folder (parsed tables, tables.cached_columns; simulated
# results, base/cache.py), not the user's: every profile folder a test copies is a new
# cache key. Made by the process that starts the session; pytest-xdist's workers inherit
# it and share it (every write is atomic), and only its maker removes it, after them.
if "PIPESIM_CACHE_DIR" not in os.environ:
    _CACHE_DIR = tempfile.mkdtemp(prefix="pipesim-test-cache-")
    os.environ["PIPESIM_CACHE_DIR"] = _CACHE_DIR
    atexit.register(shutil.rmtree, _CACHE_DIR, True)

PROFILE_NAME = "rtx-pro-6000-sglang-healthy"
BOX_NAME = "rtx-pro-6000-server-8x"
VLLM_PROFILE_NAME = "rtx-pro-6000-vllm"  # the same box measured with vLLM: a vLLM run needs vLLM's tables
REPO = Path(__file__).resolve().parent.parent
RAW_DIR = REPO.parent / "shared" / "reference-data" / "aiconfigurator" / "rtx_pro_6000_server"


@pytest.fixture(scope="session")
def profile():
    """The shipped profile, loaded once (its lookups are cached per object)."""
    return load_profile(PROFILE_NAME)


@pytest.fixture(scope="session")
def vllm_profile():
    return load_profile(VLLM_PROFILE_NAME)


def without_tables(profile, *names):
    """`profile` without the tables `names` (a new object: lookups are cached per object)."""
    from pipesim.profiles.profile import Profile
    from pipesim.profiles.tables import Tables

    tables = Tables({k: v for k, v in profile.tables.items() if k not in names})
    return Profile(
        profile.name,
        profile.box,
        profile.engine,
        profile.engine_version,
        profile.params,
        profile.meta,
        tables,
    )


# the host loop's terms pipesim/data/host_loop.toml adds to every profile (costs/host.py)
NEW_HOST_TERMS = (
    "sched_base_us",
    "sched_per_req_us",
    "sched_per_prefill_token_us",
    "prep_base_us",
    "prep_per_req_us",
    "out_step_base_us",
    "out_step_per_req_us",
    "launch_us_per_kernel",
    "piecewise_kernels_decode",
    "piecewise_kernels_mixed",
    "tp_bcast_base_us",
    "tp_bcast_per_rank_us",
    "stream_step_us",
    "stream_token_us",
)


def no_host_loop(profile, **values):
    """`profile` without the host loop's terms (and `values` set): a test of another
    mechanism (slots, KV, the front end alone) sees only the CPU costs it sets itself,
    each at its face value (host_cpu_factor 1); the profile's own values stay."""
    own = {
        k: getattr(profile.params, k)
        for k in ("frontend_ms", "detokenize_step_us", "detokenize_token_us", "cpu_hop_ms")
    }
    return profile.with_params(
        **{**own, **dict.fromkeys(NEW_HOST_TERMS, 0.0), "host_cpu_factor": 1.0, **values}
    )


def profile_for(engine: str) -> str:
    """The shipped profile measured with `engine` on the reference box."""
    return VLLM_PROFILE_NAME if engine == "vllm" else PROFILE_NAME


@pytest.fixture(scope="session")
def kimi():
    return load_model("kimi-k2.6")


@pytest.fixture(scope="session")
def llama8():
    return load_model("llama-3.1-8b")


@pytest.fixture
def raw_dir():
    """The raw AIConfigurator tables; tests comparing against them skip without it."""
    if not RAW_DIR.is_dir():
        pytest.skip(f"raw reference tables not present at {RAW_DIR}")
    return RAW_DIR


def fast_predict(profile, **kwargs):
    """pipesim.predict with the shared profile and a fixed-length measurement."""
    kwargs.setdefault("profile", profile)
    return pipesim.predict(**kwargs, ci_target=None, intervals=False)


def fast_run(scenario, **kwargs):
    return pipesim.run(scenario, **kwargs, ci_target=None)


def simulate(
    scenario,
    warmup_requests: int,
    measure_requests: int,
    setup=None,
    max_sim_s: float = 1e6,
    settings=None,
    cls=Simulation,
    **options,
):
    """Build and run a Simulation the way pipesim.run does, but hand back the
    Simulation itself so a test can read the recorder and the requests. `setup(sim)`
    runs after construction and before the first event (to wrap methods). `settings`
    (with its scheduler) replaces the scenario's engine settings; `cls` builds the
    simulation; `options` go to it (record=..., ranked=...)."""
    settings = scenario.settings if settings is None else settings
    costs = CostModel(scenario.box, scenario.model, scenario.plan, scenario.profile)
    sim = cls(
        costs,
        scenario.workload,
        settings.scheduler,
        settings,
        warmup_requests,
        measure_requests,
        **options,
    )
    if setup is not None:
        setup(sim)
    sim.run(max_sim_s)
    return sim


def finished(sim) -> list:
    """The requests a Simulation that kept them (record="full") has finished, by id."""
    return [r for r in sim.requests if r.finish_s >= 0]


def small_kv_scenario(engine: str, tokens_wanted: int = 1500, **workload):
    """Llama-3.1-8B on PP2 with the memory fraction set so the KV pool holds about
    `tokens_wanted` tokens (a few requests), so the KV cache decides admission.
    `workload` overrides the closed loop of 16 clients, prompts 100:200, outputs 10:60."""
    from pipesim.engines.reserve import startup_bytes
    from pipesim.inputs.memory import stage_weight_bytes

    profile = profile_for(engine)
    loads = ("concurrency", "input_len", "output_len", "seed", "rate_rps", "num_requests")
    knobs = {k: v for k, v in workload.items() if k not in loads}  # engine knobs: they move what is held
    base = pipesim.build_scenario(
        tp=1, pp=2, concurrency=1, model="llama-3.1-8b", engine=engine, profile=profile, **knobs
    )
    worst = max(stage_weight_bytes(base.model, base.plan, s) for s in range(2))
    per_token = max(base.memory.kv_bytes_per_token)
    want = worst + tokens_wanted * per_token
    if engine == "sglang":  # fraction x (memory - context - communicators) - weights (engines/reserve.py)
        frac = want / (base.box.gpu.memory_bytes - sum(startup_bytes(base.box, base.plan)))
    else:  # memory x utilization - weights - what vLLM holds back, which the utilization does not move
        held = max(sum(b for _, b in stage) for stage in base.memory.rule.held)
        frac = (want + held) / base.box.gpu.memory_bytes
    knob = {"mem_fraction_static": frac} if engine == "sglang" else {"gpu_memory_utilization": frac}
    load = {"concurrency": 16, "input_len": "100:200", "output_len": "10:60", "seed": 9, **workload}
    if "rate_rps" in workload:
        del load["concurrency"]
    sc = pipesim.build_scenario(
        tp=1, pp=2, model="llama-3.1-8b", engine=engine, profile=profile, **load, **knob
    )
    assert 0.6 * tokens_wanted <= sc.memory.kv_tokens <= 1.4 * tokens_wanted
    return sc


def record_launches(sim) -> list:
    """Wrap the engine instance's launch; returns a list that fills with
    (time, slot, [decode requests], [(request, chunk, prefix)], micro-batch)."""
    log = []
    engine = sim.instances[0]
    orig = engine.launch

    def launch(slot, decode, prefill):
        mb = orig(slot, decode, prefill)
        log.append((sim.env.now, slot, list(decode), list(prefill), mb))
        return mb

    engine.launch = launch
    return log


@pytest.fixture
def tiny_config(tmp_path):
    """Factory: write an HF-style config.json (Llama-like) into a fresh folder."""

    def make(**overrides):
        cfg = {
            "architectures": ["LlamaForCausalLM"],
            "num_hidden_layers": 4,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "vocab_size": 32000,
            "max_position_embeddings": 8192,
            "torch_dtype": "bfloat16",
        }
        cfg.update(overrides)
        folder = tmp_path / f"tiny{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        path = folder / "config.json"
        path.write_text(json.dumps(cfg))
        return path

    return make


# short Llama-3.1-8B requests: a quick run, as keywords and as command-line flags
SHORT_LLAMA = {"model": "llama-3.1-8b", "input_len": "16", "output_len": "8"}
SHORT_LLAMA_ARGS = ["--model", "llama-3.1-8b", "--input-len", "16", "--output-len", "8"]
SMALL_SWEEP = dict(input_len="64", output_len="40")  # short requests: a quick sweep
SMALL_SWEEP_CONC = [1, 8]


@pytest.fixture(scope="session")
def serial(profile):
    """Kimi on the 8 GPUs: four splits x two concurrencies, swept in this process (the
    table the sweep, search and files tests share)."""
    from pipesim.explore.sweep import sweep

    return sweep(8, SMALL_SWEEP_CONC, profile=profile, workers=1, **SMALL_SWEEP)

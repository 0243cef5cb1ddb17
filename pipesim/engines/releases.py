"""What changed between engine releases that decides how the host loop is hidden and how
batches form: each rule with the release it holds from (docs/host-loop.md §1-3, read in
the tree of each tag; docs/engines.md §10 tabulates them).

The costs of the host loop's terms per release are data (pipesim/data/host_loop.toml,
profiles/hostloop.py); this module holds the rules, which the engines' configs resolve
with their knobs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..profiles.importers.aiconfigurator_layout import version_key

# vLLM: V1 became the default in v0.8.0 (vllm/envs.py `VLLM_USE_V1`); v0.8.0's
# `EngineArgs._is_v1_supported_oracle` (vllm/engine/arg_utils.py) still fell back to V0
# for pipeline parallelism ("PP is supported on V1, but off by default for now"); v0.9.2
# has no such fallback (docs/host-loop.md §2.1). pipesim takes 0.9.0 as the first V1
# release under PP (between the two trees read).
VLLM_V1 = "0.8.0"
VLLM_V1_PP = "0.9.0"
# the API server and the engine in separate processes unless --disable-frontend-
# multiprocessing (`build_async_engine_client_from_engine_args`, v0.6.0, vllm PR #6883);
# the async output processor (vllm PRs #7049, #7921) and --num-scheduler-steps (#7000),
# read in v0.6.0-v0.6.6.post1 (docs/host-loop.md §1.2-1.4)
VLLM_V0_SPLIT = "0.6.0"
# --async-scheduling: absent in v0.9.2, present (default False) in v0.10.1.1-v0.13.0;
# default on unless incompatible from v0.14.0 (`VllmConfig.__post_init__`, vllm PR
# #27614), pipeline parallelism among the incompatible in v0.14.0 (docs/host-loop.md §2.4)
VLLM_ASYNC = "0.10.0"
VLLM_ASYNC_DEFAULT = "0.14.0"
# V0: `EngineArgs.enable_chunked_prefill` None -> on only for max_model_len > 32K
# (`create_engine_config`, v0.5.3.post1-v0.6.6.post1; docs/host-loop.md §1.6)
VLLM_V0_LONG_CONTEXT = 32 * 1024
# SGLang: the overlap scheduler is on by default from v0.3.6 (`ServerArgs.
# disable_overlap_schedule = False`); v0.3.4.post2 and v0.3.5 had it opt-in and
# experimental (docs/host-loop.md §3.2). DP attention turned it off in v0.3.6 and v0.4.0,
# no longer in v0.4.6.post5: pipesim takes 0.4.6 as the first release without that rule.
SGLANG_OVERLAP = "0.3.6"
SGLANG_OVERLAP_DP_ATTENTION = "0.4.6"


def at_least(version: str, release: str) -> bool:
    return version_key(version) >= version_key(release)


@dataclass(frozen=True)
class HostRules:
    """How a resolved engine runs its host loop (docs/host-loop.md §6.2)."""

    version: str  # the engine release modelled
    generation: str  # "V0" / "V1" for vLLM, "" for SGLang
    overlap: bool  # the next step's CPU runs while the GPU computes (SGLang overlap, V1 async)
    launch_on_loop: bool  # the engine loop's thread launches the first stage's kernels
    async_output: bool = False  # vLLM V0: a step's output processing under the next step's GPU
    scheduler_steps: int = 1  # vLLM V0 multi-step: one schedule per this many decode steps
    why: str = ""  # where the overlap is off though the release has it, and why


def vllm_generation(version: str, pp: int) -> str:
    """V0 before v0.8.0, and under PP before v0.9 (the v0.8 fallback); V1 after."""
    if not at_least(version, VLLM_V1) or (pp > 1 and not at_least(version, VLLM_V1_PP)):
        return "V0"
    return "V1"


def sglang_rules(version: str, pp: int, tp: int, dp_attention: bool, disabled: bool) -> HostRules:
    """SGLang's overlap scheduler: on by default from v0.3.6, off with
    `--disable-overlap-schedule`, under PP (`pp_size > 1`: v0.4.6.post5, v0.5.2, v0.5.14)
    and with DP attention before v0.4.6 (`ServerArgs.__post_init__`, v0.3.6, v0.4.0).
    Without it the scheduler process runs the forward itself (its thread launches the
    kernels); with it the forward runs on `TpModelWorkerClient`'s thread
    (tp_worker_overlap_thread.py) while the scheduler prepares the next batch."""
    why = ""
    if not at_least(version, SGLANG_OVERLAP):
        why = f"opt-in before {SGLANG_OVERLAP}"
    elif disabled:
        why = "--disable-overlap-schedule"
    elif pp > 1:
        why = "off under pipeline parallelism"
    elif dp_attention and not at_least(version, SGLANG_OVERLAP_DP_ATTENTION):
        why = f"off with DP attention before {SGLANG_OVERLAP_DP_ATTENTION}"
    overlap = not why
    return HostRules(version, "", overlap, launch_on_loop=not overlap, why=why)

"""vLLM: its knobs, their defaults by release, and how they resolve (the loops that
run them: vllm_loop.py for V1, vllm_v0.py for V0).

Source: vllm-project/vllm, vllm/v1/engine/core.py (`step_with_batch_queue`),
vllm/config/vllm.py (`max_concurrent_batches`), vllm/v1/core/sched/scheduler.py,
vllm/engine/arg_utils.py (`get_batch_defaults`); V0 (before v0.8): vllm_v0.py.

- Up to `max_concurrent_batches` batches in flight: pp_size (pp_size + 1 with async
  scheduling on the V2 model runner). While the queue has room and requests can be
  scheduled, the engine schedules and launches a new batch without blocking;
  otherwise it blocks on the oldest batch.
- The scheduler skips requests already in flight, so a decoding request stays in the
  group it was first scheduled with: groups form implicitly. `max_num_seqs` caps the
  total running requests, not each group.
- Chunked prefill is mixed with decode in one batch under a token budget
  (`max_num_batched_tokens`); running requests are scheduled before waiting ones.
- Defaults for `vllm serve` on GPUs with >= 70 GiB: max_num_seqs 1024,
  max_num_batched_tokens 8192; gpu_memory_utilization 0.9.
- The host loop (docs/host-loop.md §2, costs/host.py): each step costs the engine core
  sched + prep before its launch; with async scheduling the next step's is done while
  this one runs (two batches in flight); with TP = PP = 1 the model runner is in the
  engine core's process, so its thread also launches the kernels (`UniProcExecutor`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from ..base.checks import MAX_BATCH_TOKENS, MAX_RUNNING
from ..base.errors import require
from ..profiles.hostloop import newest as newest_version
from .graphs import vllm_capture_sizes as capture_sizes
from .knobs import check_values, knob
from .kv import VLLM_BLOCK_SIZE
from .releases import VLLM_ASYNC, VLLM_ASYNC_DEFAULT, HostRules, at_least, vllm_generation
from .reserve import vllm_rule
from .vllm_loop import VLLMSettings
from .vllm_v0 import resolve_v0

if TYPE_CHECKING:
    from ..inputs.box import Box
    from ..inputs.memory import MemoryRule
    from ..inputs.model import Model
    from ..inputs.plan import Plan

GiB = 2**30


@dataclass(frozen=True)
class VLLMConfig:
    """vLLM launch flags pipesim models, each declared once (engines/knobs.py; flags and
    defaults as vllm/engine/arg_utils.py `EngineArgs` has them, every boolean with its
    --no- form: `_compute_kwargs` gives it argparse's BooleanOptionalAction). None
    means vLLM derives the value, as `resolve` does."""

    max_num_seqs: int | None = knob(
        None,
        help="total running requests",
        default_text="1024 on GPUs of 70 GiB or more, else 256",
        bounds=(1, MAX_RUNNING),
        source="arg_utils.py `get_batch_defaults`",
    )
    max_num_batched_tokens: int | None = knob(
        None,
        help="token budget per batch (prefill chunks and decodes together)",
        default_text="8192 on GPUs of 70 GiB or more, else 2048",
        bounds=(1, MAX_BATCH_TOKENS),
        source="arg_utils.py `get_batch_defaults`",
    )
    async_scheduling: bool | None = knob(
        None,
        help="async scheduling: the next step is scheduled while this one runs (one more batch in flight)",
        default_text="from 0.14: on at pp 1, off with pp > 1; 0.10-0.13: off; none before 0.10",
        negatable=True,
        source="config/vllm.py `VllmConfig.__post_init__`, `max_concurrent_batches` (PR #27614)",
    )
    gpu_memory_utilization: float = knob(
        0.9,
        help="share of GPU memory for weights + KV cache, in (0, 1)",
        bounds=(0, 1),
        source="config/cache.py `CacheConfig.gpu_memory_utilization`",
    )
    enforce_eager: bool = knob(
        False,
        help="launch every kernel eagerly: no CUDA graphs",
        negatable=True,
        source="config/model.py `ModelConfig.enforce_eager`",
    )
    enable_prefix_caching: bool | None = knob(
        None,
        help="a preempted request's KV blocks stay cached while free, so it resumes from them",
        default_text="on in V1 (0.8 on), off in V0",
        negatable=True,
        source="config/cache.py `CacheConfig.enable_prefix_caching` (on in V1); V0 engine/arg_utils.py",
    )
    enable_chunked_prefill: bool | None = knob(
        None,
        help="prompts split into chunks that share a batch with decodes; off: V0 runs a new prompt alone",
        default_text="on in V1; V0: on only above 32K context",
        negatable=True,
        source="engine/arg_utils.py `EngineArgs.enable_chunked_prefill`, `create_engine_config` (V0: v0.5-v0.6)",
    )
    num_scheduler_steps: int = knob(
        1,
        help="V0 (0.6-0.7) multi-step scheduling: decode steps run per schedule",
        bounds=(1, 256),
        source="engine/arg_utils.py `EngineArgs.num_scheduler_steps` (V0, v0.6.0-v0.6.6.post1)",
    )
    disable_async_output_proc: bool = knob(
        False,
        help="V0 (0.6-0.7): process a step's outputs before the next step, not under its GPU time",
        source="engine/arg_utils.py `EngineArgs.disable_async_output_proc` (V0, store_true)",
    )

    name: ClassVar[str] = "vllm"
    title: ClassVar[str] = "vLLM"
    partition_rule: ClassVar[str] = "vllm"
    # the knobs a planner sweeps: the running cap and the token budget (explore/screen.py)
    running_cap_knob: ClassVar[str] = "max_num_seqs"
    prefill_chunk_knob: ClassVar[str] = "max_num_batched_tokens"
    derived_from: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType({})  # none of its knobs

    def validate(self) -> None:
        """Every knob within its declaration (`knobs.check_values`)."""
        check_values(VLLMConfig, asdict(self))

    def memory_fraction(self, gpu_memory_bytes: float, tp: int, pp: int) -> float:
        return self.gpu_memory_utilization

    def batch_limits(self, gpu_memory_bytes: float) -> tuple[int, int]:
        """(max_num_seqs, max_num_batched_tokens): given, else `get_batch_defaults` by GPU memory."""
        big = gpu_memory_bytes >= 70 * GiB
        seqs = self.max_num_seqs or (1024 if big else 256)
        return seqs, self.max_num_batched_tokens or (8192 if big else 2048)

    def memory_rule(self, box: Box, plan: Plan, model: Model, version: str) -> MemoryRule:
        """How vLLM sizes its KV pool at `version` (engines/reserve.py): its profiling run
        at the batch limits, the CUDA graphs it captures unless eager."""
        seqs, tokens = self.batch_limits(box.gpu.memory_bytes)
        sizes = () if self.enforce_eager else capture_sizes(seqs, tokens)
        util = self.gpu_memory_utilization
        return vllm_rule(util, seqs, tokens, sizes, box, plan, model, version)

    def resolve(
        self, gpu_memory_bytes: float, plan: Plan, model: Model, kv_tokens: int, version: str | None = None
    ) -> VLLMSettings:
        version = version or newest_version("vllm")
        if vllm_generation(version, plan.pp) == "V0":
            return VLLMSettings(**resolve_v0(self, plan, model, kv_tokens, version))
        require(
            self.num_scheduler_steps == 1 and not self.disable_async_output_proc,
            f"--num-scheduler-steps and --disable-async-output-proc are vLLM V0's (0.6-0.7); vLLM {version} "
            "runs V1",
        )
        require(
            not self.async_scheduling or at_least(version, VLLM_ASYNC),
            f"--async-scheduling: vLLM {version} has no async scheduling (from {VLLM_ASYNC} on)",
        )
        seqs, tokens = self.batch_limits(gpu_memory_bytes)
        # async scheduling: None means on unless incompatible since vllm PR #27614 (v0.14.0,
        # VllmConfig "Enable async scheduling unless there is an incompatible option"; off
        # before); with PP the V1 model runner does not overlap (max_concurrent_batches =
        # pp), so pipesim's default there is off (docs/engines.md §6)
        default_async = plan.pp == 1 and at_least(version, VLLM_ASYNC_DEFAULT)
        async_on = default_async if self.async_scheduling is None else self.async_scheduling
        inflight = plan.pp + 1 if (async_on and plan.pp > 1) else (2 if async_on else plan.pp)
        sizes = () if self.enforce_eager else capture_sizes(seqs, tokens)
        # TP = PP = 1: the model runner in the engine core's process (UniProcExecutor), whose
        # thread launches the kernels; else the workers' processes do (docs/host-loop.md §2.2)
        rules = HostRules(version, "V1", async_on, launch_on_loop=plan.tp == 1 and plan.pp == 1)
        return VLLMSettings(
            seqs,
            tokens,
            async_on,
            inflight,
            kv_tokens // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE,  # whole blocks (num_gpu_blocks)
            self.gpu_memory_utilization,
            max(sizes, default=0),
            sizes,
            True if self.enable_prefix_caching is None else self.enable_prefix_caching,
            chunked_prefill=True if self.enable_chunked_prefill is None else self.enable_chunked_prefill,
            host=rules,
        )

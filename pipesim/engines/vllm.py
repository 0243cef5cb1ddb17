"""vLLM: its knobs, their defaults by release, and its batch-queue scheduling.

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

from collections import deque
from collections.abc import Generator, Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

import simpy

from ..base.checks import MAX_BATCH_TOKENS, MAX_RUNNING
from ..base.errors import require
from ..profiles.hostloop import newest as newest_version
from .graphs import padded_size
from .graphs import vllm_capture_sizes as capture_sizes
from .knobs import check_values, knob
from .kv import VLLM_BLOCK_SIZE, FreeBlockQueue, blocks_for, take
from .protocol import EngineSimulation
from .releases import VLLM_ASYNC, VLLM_ASYNC_DEFAULT, HostRules, at_least, vllm_generation
from .routing import LeastLoaded
from .vllm_v0 import resolve_v0, returned_v0, run_v0

if TYPE_CHECKING:
    from ..inputs.model import Model
    from ..inputs.plan import Plan
    from .batches import MicroBatch, Request

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
    derived_from: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType({})  # none of its knobs

    def validate(self) -> None:
        """Every knob within its declaration (`knobs.check_values`)."""
        check_values(VLLMConfig, asdict(self))

    def memory_fraction(self, gpu_memory_bytes: float, tp: int, pp: int) -> float:
        return self.gpu_memory_utilization

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
        big = gpu_memory_bytes >= 70 * GiB
        seqs = self.max_num_seqs or (1024 if big else 256)
        tokens = self.max_num_batched_tokens or (8192 if big else 2048)
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


@dataclass(frozen=True)
class VLLMSettings:
    max_num_seqs: int
    max_num_batched_tokens: int
    async_scheduling: bool
    max_concurrent_batches: int
    kv_tokens: int
    gpu_memory_utilization: float
    cudagraph_max_tokens: int  # 0: enforce_eager
    cudagraph_capture_sizes: tuple = ()
    enable_prefix_caching: bool = True
    chunked_prefill: bool = True
    host: HostRules = HostRules("", "V1", False, False)
    virtual_engines: int = 1  # V0 under PP: one scheduler per stage (vllm_v0.py)

    def graphed(self, decode: int, prefill_tokens: int) -> bool:
        """vLLM V1 captures (piecewise) CUDA graphs for batches up to its largest
        capture size, mixed prefill included; V0 for decode batches only
        (vllm/worker/model_runner.py, v0.6.3.post1: prefill runs eagerly)."""
        if self.host.generation == "V0" and prefill_tokens:
            return False
        return 0 < decode + prefill_tokens <= self.cudagraph_max_tokens

    def graph_tokens(self, decode: int, prefill_tokens: int) -> int:
        """Tokens the batch runs at: padded to the next captured size (the CUDA-graph
        dispatcher, docs/engines.md §5); 0 when it runs eagerly."""
        return (
            padded_size(self.cudagraph_capture_sizes, decode + prefill_tokens)
            if self.cudagraph_capture_sizes
            else 0
        )

    @property
    def running_cap(self) -> int:
        """`max_num_seqs` caps the running requests, per virtual engine in V0 under PP
        (EngineSettings)."""
        return self.max_num_seqs * self.virtual_engines

    @property
    def slot_cap(self) -> int:
        """vLLM has no per-slot cap: `max_num_seqs` caps the total, not each group (EngineSettings)."""
        return 0

    @property
    def async_depth(self) -> int:
        """vLLM sends a batch's outputs back as soon as they are sampled (EngineSettings)."""
        return 0

    @property
    def inflight_groups(self) -> int:
        """The batches in flight, whose requests form vLLM's implicit groups
        (`max_concurrent_batches`; EngineSettings)."""
        return self.max_concurrent_batches

    @property
    def slots(self) -> int:
        """vLLM has no micro-batch slots: every batch launches as slot 0 and groups
        form implicitly (see the module docstring)."""
        return 1

    def describe(self) -> dict:
        """The resolved knobs for the scenario description (`scenario.engine`)."""
        return {"engine": "vllm", **asdict(self)}

    def scheduler(self, sim: EngineSimulation) -> VLLMScheduler:
        return VLLMScheduler(sim, self)

    def router(self, dp: int) -> LeastLoaded:
        """The load-balancing front end over the coordinator's counts (routing.py)."""
        return LeastLoaded(dp)


class VLLMScheduler:
    """vLLM V1's batch-queue loop (`step_with_batch_queue`); V0's engine loop over its
    virtual engines (vllm_v0.py)."""

    def __init__(self, sim: EngineSimulation, settings: VLLMSettings):
        self.sim, self.s = sim, settings
        self.active: list = []  # admitted requests, in admission order
        self.queue: deque = deque()  # in-flight batches, oldest first
        self.host = sim.host  # the host loop's terms (costs/host.py)
        # async scheduling (AsyncScheduler): a request in flight is scheduled again with a
        # placeholder token, in at most two batches; with PP a decode is eligible again
        # pp steps later (next_decode_eligible_step), or once its outputs are back;
        # docs/engines.md §6
        self.repeat = 2 if settings.async_scheduling else 1
        self.pp = sim.pp
        self.step = 0
        self.eligible: dict[int, int] = {}
        self.computed: dict[int, int] = {}  # rid -> num_computed_tokens once scheduled
        # prefix caching: a preempted request's blocks stay cached while free (kv.py)
        self.free_queue = FreeBlockQueue(sim.kv_free) if settings.enable_prefix_caching else None
        self.v0 = settings.host.generation == "V0"
        self.ve_used = [0] * settings.virtual_engines  # V0: KV tokens held per virtual engine

    def run(self) -> Generator[simpy.Event, object, None]:
        """Launch while the queue has room and a batch can be formed, else block on
        the oldest batch in flight, else wait for an arrival. Each launch costs the
        engine core the step's schedule and input preparation first, and its launches
        after where its thread launches the kernels (`launch_on_loop`)."""
        if self.v0:
            yield from run_v0(self)
        sim, host, on_loop = self.sim, self.host, self.s.host.launch_on_loop
        while True:
            if len(self.queue) < self.s.max_concurrent_batches:
                batch = self.form()
                if batch is not None:
                    yield from sim.charge(
                        host.before_launch(len(batch[0]) + len(batch[1]), sum(c for _, c, _ in batch[1]))
                    )
                    mb = sim.launch(0, *batch)
                    self.queue.append(mb)
                    if on_loop:
                        yield from sim.charge(
                            (("launch", host.launch_s(0, mb.shape.graphed, bool(mb.prefill))),)
                        )
                    continue
            if self.queue:
                yield self.queue.popleft().returned
                continue
            yield sim.wait_arrival()

    def form(self) -> tuple[list, list] | None:
        """(decode requests, prefill chunks) of the next batch, or None.

        KV as `Scheduler.schedule` does it (docs/engines.md §4): each scheduled request
        gets the blocks its computed tokens need (`allocate_slots`); when a running
        request cannot, the last running request is preempted (FCFS
        `self.running.pop()`), until it can or it preempted itself; after a preemption
        no waiting request is admitted in that step; a waiting request whose first chunk
        finds no blocks stops admission."""
        sim, s = self.sim, self.s
        budget = s.max_num_batched_tokens
        decode, prefill = [], []
        preempted = False
        i = 0
        while i < len(self.active) and budget > 0:  # running first (vLLM V1 order)
            r = self.active[i]
            i += 1
            if r.scheduled < r.prefill_len:
                # prompt chunks advance at schedule time, so a prompt can be in several batches
                n = min(r.prefill_len - r.scheduled, budget)
            elif r.prefilled < r.prefill_len and self.repeat == 1:
                continue  # the prompt's last chunk is in flight
            elif (
                r.inflight < self.repeat
                and r.generated + r.inflight < r.output_len
                and (not r.inflight or self.eligible.get(r.rid, 0) <= self.step)
            ):
                n = 1
            else:
                continue
            while not self._allocate(r, n):
                preempted = True
                victim = self.active.pop()
                self._preempt(victim)
                if victim is r:
                    break
            if r.queued is not None:
                break  # it could not be scheduled
            if n == 1 and r.scheduled >= r.prefill_len:
                decode.append(r)
                if self.pp > 1 and self.repeat > 1:
                    self.eligible[r.rid] = self.step + self.pp
            else:
                prefill.append((r, n, r.scheduled))
                r.scheduled += n
            budget -= n
        while not preempted and sim.waiting and budget > 0 and len(self.active) < s.max_num_seqs:
            r = sim.waiting[0]
            if r.inflight:
                break  # preempted with a batch still in flight: it resumes once that is back
            hit = self._cache_hit(r)
            n = min(r.input_len + r.generated - hit, budget)
            if n < r.input_len + r.generated - hit and not s.chunked_prefill:
                break  # without chunked prefill a prompt waits for a budget it fits whole
            if not self._allocate(r, n, fresh=True, hit=hit):
                break
            sim.waiting.popleft()
            sim.admit(r)
            self.active.append(r)
            prefill.append((r, n, hit))
            r.prefilled, r.scheduled = hit, hit + n
            budget -= n
        if not decode and not prefill:
            return None
        self.step += 1
        return decode, prefill

    def _allocate(self, r, n: int, fresh: bool = False, hit: int = 0) -> bool:
        """`KVCacheManager.allocate_slots`: the blocks `r` needs for `n` more computed
        tokens (ceil(computed / block_size) in all), or False when the pool lacks them.
        A resuming request's `hit` cached tokens are counted as needed too (its blocks
        are free until touched: `num_evictable_computed_blocks`)."""
        sim = self.sim
        computed = n + (hit if fresh else self.computed.get(r.rid, 0))
        need = blocks_for(computed) * VLLM_BLOCK_SIZE - (0 if fresh else r.kv_reserved)
        if need > sim.kv_free:
            return False
        take(sim, r, need)
        if self.free_queue is not None:
            self.free_queue.take(need, r.rid if fresh else None, hit)
        self.computed[r.rid] = computed
        return True

    def _cache_hit(self, r) -> int:
        """`get_computed_blocks`: tokens of a waiting request's own prefix still cached,
        whole blocks, at most num_tokens - 1 (the last token is always computed)."""
        if self.free_queue is None:
            return 0
        cap = (r.input_len + r.generated - 1) // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE
        return min(self.free_queue.hit(r.rid), cap)

    def _preempt(self, r) -> None:
        """`_preempt_request`: free its blocks, num_computed_tokens = 0, to the front of
        the waiting queue (recompute: it prefills prompt and outputs again, less the
        prefix still cached when it resumes, with prefix caching on)."""
        computed = self.computed.pop(r.rid, 0)
        if self.free_queue is not None:
            full = min(computed, r.input_len + r.generated) // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE
            self.free_queue.free(r.kv_reserved, r.rid, full)
        self.eligible.pop(r.rid, None)
        self.sim.requeue(r, front=True)

    def on_return(self, mb: MicroBatch, finished: list[Request]) -> None:
        """Finished requests leave the running set."""
        if self.v0:
            returned_v0(self, finished)
        if finished:
            done = {id(r) for r in finished}
            self.active = [r for r in self.active if id(r) not in done]
            for r in finished:
                self.eligible.pop(r.rid, None)
                self.computed.pop(r.rid, None)
                if self.free_queue is not None:
                    self.free_queue.drop(r.rid)
                    self.free_queue.free(r.kv_reserved)  # 0 if it was preempted

"""vLLM's loop: its knobs resolved to what the engine runs with (`VLLMSettings`, made by
vllm.py's `VLLMConfig.resolve`), and V1's scheduler (`VLLMScheduler`, the batch queue;
V0's engine loop is vllm_v0.py's).

Source and rules: vllm.py's docstring (docs/engines.md §4-§6, docs/host-loop.md §2).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import simpy

from .graphs import padded_size
from .kv import VLLM_BLOCK_SIZE, FreeBlockQueue, blocks_for, take
from .protocol import EngineSimulation
from .releases import HostRules
from .routing import LeastLoaded
from .vllm_v0 import returned_v0, run_v0

if TYPE_CHECKING:
    from .batches import MicroBatch, Request


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
    def in_flight(self) -> int:
        """`max_concurrent_batches` (EngineSettings)."""
        return self.max_concurrent_batches

    @property
    def prefill_budget(self) -> int:
        """`max_num_batched_tokens`: the token budget of a batch, decodes and prompt
        chunks together (EngineSettings)."""
        return self.max_num_batched_tokens

    @property
    def mixes_prefill(self) -> bool:
        """Prompt chunks ride with the decodes of the same batch (EngineSettings): always
        in V1; in V0 only with chunked prefill, without it a step that admits prompts
        runs them alone (vllm_v0.py `form_ve`, docs/host-loop.md §1.6)."""
        return self.chunked_prefill or self.host.generation != "V0"

    @property
    def batches_per_request(self) -> int:
        """With async scheduling a request in flight is scheduled again with a
        placeholder token: it rides two batches at once (`VLLMScheduler.repeat`;
        EngineSettings)."""
        return 2 if self.async_scheduling else 1

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
        self.repeat = settings.batches_per_request
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

    def _allocate(self, r: Request, n: int, fresh: bool = False, hit: int = 0) -> bool:
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

    def _cache_hit(self, r: Request) -> int:
        """`get_computed_blocks`: tokens of a waiting request's own prefix still cached,
        whole blocks, at most num_tokens - 1 (the last token is always computed)."""
        if self.free_queue is None:
            return 0
        cap = (r.input_len + r.generated - 1) // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE
        return min(self.free_queue.hit(r.rid), cap)

    def _preempt(self, r: Request) -> None:
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

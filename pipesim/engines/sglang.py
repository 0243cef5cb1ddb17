"""SGLang: its knobs, their defaults, and its pipeline-parallel scheduler loop.

Source: sgl-project/sglang, python/sglang/srt/managers/scheduler_pp_mixin.py
(`event_loop_pp`), scheduler.py, server_args.py, model_executor/model_runner.py.

- The PP loop runs `pp_loop_size = pp_size + pp_async_batch_depth` micro-batch slots;
  every stage visits them in the same fixed order; each slot owns a running batch.
- At a slot's turn the first stage first takes that slot's previous results (it
  blocks on the outputs relayed from the last stage), then forms the slot's next
  batch: prefill-first (`get_next_batch_to_run`): when requests wait, a (chunked)
  prefill batch instead of the slot's decode batch; prefill and decode never mix.
- A request joins the slot that prefilled it and stays there until it finishes.
- Per-slot cap `pp_max_micro_batch_size`, default `max(max_running_requests //
  pp_size, 1)` (`Scheduler.__init__`), checked by `get_num_allocatable_reqs`;
  the total is bounded by `max_running_requests` and free KV-cache tokens.
- A chunked prefill is scheduler-wide (`self.chunked_req`): its next chunk goes into
  whichever slot comes next, and is admitted even when that slot is at its cap.
- With pp_size 1 the normal loop runs: one batch at a time.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

import simpy

from ..base.checks import MAX_ASYNC_DEPTH, MAX_BATCH_TOKENS, MAX_RUNNING
from ..profiles.hostloop import newest as newest_version
from .graphs import padded_size
from .graphs import sglang_capture_sizes as capture_sizes
from .knobs import check_values, knob
from .kv import CLIP_MAX_NEW_TOKENS, NewTokenRatio, decode_memory, retract_decode, take
from .protocol import EngineSimulation
from .releases import HostRules, sglang_rules
from .routing import RoundRobin

if TYPE_CHECKING:
    from ..inputs.model import Model
    from ..inputs.plan import Plan
    from .batches import MicroBatch, Request

MiB = 2**20


@dataclass(frozen=True)
class SGLangConfig:
    """SGLang launch flags pipesim models, each declared once (engines/knobs.py; flags
    and defaults as python/sglang/srt/server_args.py `ServerArgs` has them). None means
    SGLang derives the value, as `resolve` does."""

    max_running_requests: int | None = knob(
        None,
        help="total running requests (with DP attention: split over the ranks)",
        default_text="min(KV tokens // 2, request pool of 2048-4096)",
        bounds=(1, MAX_RUNNING),
        source="server_args.py `max_running_requests`; model_runner.py (request pool)",
    )
    pp_max_micro_batch_size: int | None = knob(
        None,
        help="per-slot cap of running requests",
        default_text="max(max-running-requests // pp, 1)",
        bounds=(1, MAX_RUNNING),
        source="server_args.py `pp_max_micro_batch_size`; scheduler.py `Scheduler.__init__`",
    )
    pp_async_batch_depth: int = knob(
        0,
        help="extra micro-batch slots: the last PP rank holds a batch's outputs this many iterations",
        bounds=(0, MAX_ASYNC_DEPTH),
        source="server_args.py `pp_async_batch_depth`; scheduler_pp_mixin.py `event_loop_pp`",
    )
    chunked_prefill_size: int | None = knob(
        None,
        help="prefill chunk tokens (with DP attention: divided by dp)",
        default_text="by GPU memory: 2048, 4096, 8192 or 16384",
        bounds=(1, MAX_BATCH_TOKENS),
        source="server_args.py `chunked_prefill_size` (its default by GPU memory)",
    )
    max_prefill_tokens: int = knob(
        16384,
        help="token budget of one prefill batch",
        bounds=(1, MAX_BATCH_TOKENS),
        source="server_args.py `max_prefill_tokens`; schedule_policy.py `PrefillAdder`",
    )
    mem_fraction_static: float | None = knob(
        None,
        help="share of GPU memory for weights + KV cache, in (0, 1)",
        default_text="by GPU memory, tp and pp",
        bounds=(0, 1),
        source="server_args.py `_handle_gpu_memory_settings`",
    )
    disable_cuda_graph: bool = knob(
        False,
        help="launch every kernel eagerly: no CUDA graphs",
        source="server_args.py `disable_cuda_graph` (store_true)",
    )
    cuda_graph_max_bs: int | None = knob(
        None,
        help="largest decode batch replayed as a CUDA graph",
        default_text="by GPU memory and tp",
        bounds=(1, MAX_RUNNING),
        source="server_args.py `cuda_graph_max_bs`, `_generate_cuda_graph_batch_sizes`",
    )
    disable_overlap_schedule: bool = knob(
        False,
        help="no overlap scheduler: the next batch is scheduled after this one's results (on from 0.3.6 otherwise)",
        source="server_args.py `disable_overlap_schedule` (store_true); scheduler.py `event_loop_overlap`",
    )

    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    partition_rule: ClassVar[str] = "sglang"
    # knobs the engine derives from another when not given (Scheduler.__init__:
    # pp_max_micro_batch_size = max(max_running_requests // pp_size, 1)): a profile's
    # deployment value for them does not apply once the user gives the source knob
    derived_from: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {"max_running_requests": ("pp_max_micro_batch_size",)}
    )

    def validate(self) -> None:
        """Every knob within its declaration (`knobs.check_values`)."""
        check_values(SGLangConfig, asdict(self))

    def graph_max_bs(self, gpu_memory_bytes: float, tp: int) -> int:
        """`cuda_graph_max_bs` default by GPU memory and tp (server_args.py): decode
        batches up to this size replay a CUDA graph."""
        if self.cuda_graph_max_bs is not None:
            return self.cuda_graph_max_bs
        gb = gpu_memory_bytes / MiB / 1024
        if gb < 20:
            return 8
        if gb < 35:
            return 24 if tp < 4 else 80
        if gb < 60:
            return 32 if tp < 4 else 160
        return (256 if tp < 4 else 512) if gb < 160 else 512

    def memory_fraction(self, gpu_memory_bytes: float, tp: int, pp: int) -> float:
        """`mem_fraction_static` default (server_args.py, _handle_gpu_memory_settings):
        reserve 512 MB + 1.5 x chunk + 2 x cuda-graph batch + tp*pp/8 GB, at least
        10 GB on GPUs above 60 GB."""
        if self.mem_fraction_static is not None:
            return self.mem_fraction_static
        mem_mb = gpu_memory_bytes / MiB
        graph_bs = self.graph_max_bs(gpu_memory_bytes, tp)
        reserved = (
            512 + max(self.chunk_size(gpu_memory_bytes), 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
        )
        if mem_mb > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        return round((mem_mb - reserved) / mem_mb, 3)

    def chunk_size(self, gpu_memory_bytes: float) -> int:
        """`chunked_prefill_size` default by GPU memory (server_args.py)."""
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        gb = gpu_memory_bytes / MiB / 1024
        return 2048 if gb < 35 else 4096 if gb < 60 else 8192 if gb < 160 else 16384

    def resolve(
        self, gpu_memory_bytes: float, plan: Plan, model: Model, kv_tokens: int, version: str | None = None
    ) -> SGLangSettings:
        # model_runner.py: req pool = clamp(kv_tokens / context_len * 512, 2048, 4096);
        # max_running_requests = min(kv_tokens // 2, req pool) unless given.
        pool = min(max(int(kv_tokens / model.max_context * 512), 2048), 4096)
        # with DP attention every rank is a scheduler of its own (kv_tokens is one rank's
        # pool); the given --max-running-requests is split over the ranks and the chunk
        # divided by dp (docs/engines.md §8)
        dp = plan.dp if plan.dp_attention else 1
        given = self.max_running_requests and max(self.max_running_requests // dp, 1)
        mrr = given or min(kv_tokens // 2, pool)
        mrr = max(1, min(mrr, pool))
        cap = self.pp_max_micro_batch_size or max(mrr // plan.pp, 1)
        slots = plan.pp + self.pp_async_batch_depth if plan.pp > 1 else 1
        return SGLangSettings(
            max_running_requests=mrr,
            pp_max_micro_batch_size=cap,
            pp_async_batch_depth=self.pp_async_batch_depth,
            slots=slots,
            chunked_prefill_size=max(self.chunk_size(gpu_memory_bytes) // dp, 1),
            max_prefill_tokens=self.max_prefill_tokens,
            kv_tokens=kv_tokens,
            mem_fraction_static=self.memory_fraction(gpu_memory_bytes, plan.tp, plan.pp),
            cuda_graph_max_bs=0 if self.disable_cuda_graph else self.graph_max_bs(gpu_memory_bytes, plan.tp),
            host=sglang_rules(
                version or newest_version("sglang"),
                plan.pp,
                plan.tp,
                plan.dp_attention,
                self.disable_overlap_schedule,
            ),
        )


@dataclass(frozen=True)
class SGLangSettings:
    """Every SGLang knob resolved to the value the engine would run with."""

    max_running_requests: int
    pp_max_micro_batch_size: int
    pp_async_batch_depth: int
    slots: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    kv_tokens: int
    mem_fraction_static: float
    cuda_graph_max_bs: int  # 0: CUDA graphs disabled
    # the overlap scheduler, by release (releases.py); by default none, the loop's thread launching
    host: HostRules = HostRules("", "", overlap=False, launch_on_loop=True)

    @property
    def running_cap(self) -> int:
        """`max_running_requests` caps the running requests (EngineSettings)."""
        return self.max_running_requests

    @property
    def slot_cap(self) -> int:
        """`pp_max_micro_batch_size` caps each slot's running requests (EngineSettings)."""
        return self.pp_max_micro_batch_size

    @property
    def async_depth(self) -> int:
        """`pp_async_batch_depth`: the last PP rank holds a batch's outputs this many
        slot iterations (EngineSettings; docs/engines.md §3)."""
        return self.pp_async_batch_depth

    @property
    def inflight_groups(self) -> int:
        """SGLang has micro-batch slots, not implicit groups (EngineSettings)."""
        return 0

    def describe(self) -> dict:
        """The resolved knobs for the scenario description (`scenario.engine`)."""
        return {"engine": "sglang", **asdict(self)}

    def graphed(self, decode: int, prefill_tokens: int) -> bool:
        """SGLang replays CUDA graphs for decode batches up to cuda_graph_max_bs;
        prefill (extend) batches run eagerly."""
        return prefill_tokens == 0 and decode <= self.cuda_graph_max_bs

    def graph_tokens(self, decode: int, prefill_tokens: int) -> int:
        """Tokens the batch runs at: a graphed decode batch is padded to the next
        captured size (`CudaGraphRunner.replay`, docs/engines.md §5); 0 when eager."""
        if prefill_tokens or not self.cuda_graph_max_bs:
            return 0
        return padded_size(capture_sizes(self.cuda_graph_max_bs), decode)

    def scheduler(self, sim: EngineSimulation) -> SGLangScheduler:
        return SGLangScheduler(sim, self)

    def router(self, dp: int) -> RoundRobin:
        """The data-parallel controller's default rule (routing.py)."""
        return RoundRobin(dp)


class SGLangScheduler:
    """The first stage's scheduler loop over micro-batch slots."""

    def __init__(self, sim: EngineSimulation, settings: SGLangSettings):
        self.sim, self.s = sim, settings
        self.slot_running: list[list] = [[] for _ in range(settings.slots)]
        self.inflight: list = [None] * settings.slots
        self.chunked = None  # request whose prompt is partly prefilled
        self.host = sim.host  # the host loop's terms (costs/host.py)
        self.ratio = NewTokenRatio()  # schedule_conservativeness 1.0 (SGLang's default)

    def run(self) -> Generator[simpy.Event, object, None]:
        """The overlap scheduler's loop where it is on (pp = 1), else the slot loop."""
        return self._overlap() if self.s.host.overlap else self._slots()

    def _slots(self) -> Generator[simpy.Event, object, None]:
        """One pass per slot, in SGLang's order (`event_loop_pp`, docs/engines.md §2-3;
        with pp = 1 and no overlap, `event_loop_normal`): every slot iteration costs the
        rank's CPU (receive requests, form the batch, process the results: costs/host.py
        sched + prep + broadcast, or an empty iteration's), empty slots included while
        the server is busy. It launches this slot's batch, launches its kernels (the
        scheduler's own thread runs the forward), then blocks until the *next* slot's
        outputs have arrived and processes them, so its CPU time sits between a batch's
        return and the next launch; with async depth d there are pp + d slots, up to
        pp + d batches in flight, and the GPUs can work through queued batches meanwhile."""
        sim, n, host = self.sim, self.s.slots, self.host
        inflight = self.inflight
        busy = 0  # batches in flight
        owed = 0  # empty iterations not yet charged (one event for a run of them)
        while True:
            worked = False
            for slot in range(n):
                sim.next_iteration()
                batch = self.form(slot)
                nxt = (slot + 1) % n
                if batch is None and busy:
                    owed += 1
                if batch is not None:
                    yield from self._launch(slot, batch, owed)
                    owed = 0
                    busy += 1
                    worked = True
                mb = inflight[nxt]
                if mb is not None:
                    if owed:
                        yield from sim.charge(host.empty(owed))
                        owed = 0
                    yield mb.returned  # outputs relayed from the last stage
                    inflight[nxt] = None
                    busy -= 1
                    worked = True
            if not worked:
                owed = 0
                self.ratio.reset()  # the server idles (self_check_during_idle)
                yield sim.wait_arrival()

    def _launch(
        self, slot: int, batch: tuple[list, list], empties: int = 0
    ) -> Generator[simpy.Event, None, None]:
        """Charge the iteration's CPU (and `empties` empty ones before it), launch the
        slot's batch, and launch its kernels where the scheduler's thread does."""
        sim, host = self.sim, self.host
        decode, prefill = batch
        parts = host.before_launch(len(decode) + len(prefill), sum(c for _, c, _ in prefill))
        if empties:
            parts = (*parts, *host.empty(empties))
        yield from sim.charge(parts)
        mb = self.inflight[slot] = sim.launch(slot, decode, prefill)
        mb.host_s = sum(s for _, s in parts)  # every PP rank runs the same iteration (pipeline.py)
        if self.s.host.launch_on_loop:
            yield from sim.charge((("launch", host.launch_s(0, mb.shape.graphed, bool(prefill))),))

    def _overlap(self) -> Generator[simpy.Event, object, None]:
        """The overlap scheduler (`event_loop_overlap`, docs/host-loop.md §3.2): it forms
        and launches batch n+1 (its requests' last tokens still futures) before it takes
        batch n's results, so its CPU runs while the GPU computes batch n and the GPU
        runs the two back to back; the forward thread launches the kernels."""
        sim = self.sim
        prev = None
        while True:
            sim.next_iteration()
            batch = self.form(0)
            mb = None
            if batch is not None:
                yield from self._launch(0, batch)
                mb = self.inflight[0]
            if prev is not None:
                yield prev.returned
            elif mb is None:
                self.ratio.reset()  # the server idles (self_check_during_idle)
                yield sim.wait_arrival()
            prev = mb

    def form(self, slot: int) -> tuple[list, list] | None:
        """(decode requests, prefill chunks) for this slot's turn, or None. With the
        overlap scheduler a request whose token is still in flight decodes again (its
        input a future), but not past its last token."""
        prefill = self._prefill(slot)
        if prefill:
            return [], prefill
        running = self.slot_running[slot]
        ready = (
            [r for r in running if r.generated + r.inflight < r.output_len]
            if self.s.host.overlap
            else running
        )
        if ready and decode_memory(self.sim, ready, self.ratio):
            if ready is not running:
                running[:] = [r for r in running if r.queued is None]
            return list(ready), []
        if ready is not running:
            running[:] = [r for r in running if r.queued is None]
        return None

    def retract(self, running: list) -> None:
        """`retract_decode` on this scheduler's ratio (kv.py)."""
        retract_decode(self.sim, running, self.ratio)

    def _prefill(self, slot: int) -> list:
        """`PrefillAdder` over the waiting queue (docs/engines.md §4): a request is
        admitted while its prefill + min(max_new, CLIP) + one page is below the free KV
        less the reservation: the slot's running requests' remaining outputs (clipped)
        times `new_token_ratio`, plus the whole remaining output of each request
        admitted in this pass (a truncated chunk reserves none)."""
        sim, s = self.sim, self.s
        budget = min(s.chunked_prefill_size, s.max_prefill_tokens)
        chunks = []
        if self.chunked is not None:  # a chunked request continues in any slot
            r = self.chunked
            chunk = min(r.prefill_len - r.scheduled, budget, sim.kv_free)
            if chunk > 0:
                take(sim, r, chunk)
                chunks.append((r, chunk, r.scheduled))
                r.scheduled += chunk
                budget -= chunk
            if r.scheduled == r.prefill_len:
                self.chunked = None
        room = s.pp_max_micro_batch_size - len(self.slot_running[slot]) - len(chunks)
        if not sim.waiting or budget <= 0 or room <= 0:
            return chunks
        ratio = self.ratio.value
        offset = sum(min(r.output_len - r.generated, CLIP_MAX_NEW_TOKENS) for r in self.slot_running[slot])
        offset *= ratio
        if self.chunked is None and chunks:
            r = chunks[0][0]  # the chunked request's last chunk reserves its outputs
            offset += min(r.output_len - r.generated, CLIP_MAX_NEW_TOKENS)
        while sim.waiting and budget > 0 and room > 0:
            r = sim.waiting[0]
            if sim.running >= s.max_running_requests or r.inflight:
                break  # (in flight: retracted while the overlap scheduler's batch carries it)
            prefill = r.input_len + r.generated
            max_new = min(r.output_len - r.generated, CLIP_MAX_NEW_TOKENS)
            if prefill + max_new + 1 >= sim.kv_free - offset:
                break  # AddReqResult.NO_TOKEN
            sim.waiting.popleft()
            sim.admit(r)
            chunk = min(r.prefill_len, budget)
            take(sim, r, chunk)
            chunks.append((r, chunk, 0))
            r.scheduled = chunk
            budget -= chunk
            room -= 1
            if chunk < r.prefill_len:
                self.chunked = r
                break
            offset += max_new
        return chunks

    def on_return(self, mb: MicroBatch, finished: list[Request]) -> None:
        """Results of a slot's batch: newly prefilled requests join this slot (sticky),
        finished ones leave it."""
        running = self.slot_running[mb.slot]
        for r, _, _ in mb.prefill:
            if r.prefilled == r.prefill_len and r.generated < r.output_len:
                r.slot = mb.slot
                running.append(r)
        if finished:
            done = {id(r) for r in finished}
            running[:] = [r for r in running if id(r) not in done]

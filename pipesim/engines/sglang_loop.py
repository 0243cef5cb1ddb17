"""SGLang's loop: its knobs resolved to what the engine runs with (`SGLangSettings`,
made by sglang.py's `SGLangConfig.resolve`), and its scheduler (`SGLangScheduler`), the
pipeline-parallel slot loop and, at pp = 1, the overlap scheduler's loop.

Source and rules: sglang.py's docstring (docs/engines.md §2-§4, docs/host-loop.md §3).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import simpy

from .graphs import padded_size
from .graphs import sglang_capture_sizes as capture_sizes
from .kv import CLIP_MAX_NEW_TOKENS, NewTokenRatio, decode_memory, retract_decode, take
from .protocol import EngineSimulation
from .releases import HostRules
from .routing import RoundRobin

if TYPE_CHECKING:
    from .batches import MicroBatch, PrefillChunk, Request


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

    @property
    def in_flight(self) -> int:
        """A batch per slot; the overlap scheduler (pp = 1) launches the next batch
        before the last one's results are back: two (EngineSettings)."""
        return self.slots + (1 if self.host.overlap else 0)

    @property
    def prefill_budget(self) -> int:
        """Prompt tokens one prefill batch takes: the chunk, within the prefill budget
        (`PrefillAdder`, the scheduler's `_prefill`; EngineSettings)."""
        return min(self.chunked_prefill_size, self.max_prefill_tokens)

    @property
    def mixes_prefill(self) -> bool:
        """Prefill-first: a slot's turn runs a prefill batch instead of its decode batch,
        never both (EngineSettings)."""
        return False

    @property
    def batches_per_request(self) -> int:
        """A request rides its slot's batch; with the overlap scheduler it is scheduled
        again while its token is in flight, so it rides both batches (`form`;
        EngineSettings)."""
        return 2 if self.host.overlap else 1

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
        self.chunked: Request | None = None  # request whose prompt is partly prefilled
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

    def _prefill(self, slot: int) -> list[PrefillChunk]:
        """`PrefillAdder` over the waiting queue (docs/engines.md §4): a request is
        admitted while its prefill + min(max_new, CLIP) + one page is below the free KV
        less the reservation: the slot's running requests' remaining outputs (clipped)
        times `new_token_ratio`, plus the whole remaining output of each request
        admitted in this pass (a truncated chunk reserves none)."""
        sim, s = self.sim, self.s
        budget = s.prefill_budget
        chunks: list[PrefillChunk] = []
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

"""One engine instance as its scheduler sees it: the whole engine, or one DP rank.

An engine's scheduler (engines/) reads its instance's waiting queue, running count
and free KV tokens, and calls admit / requeue / launch / cpu / wait_arrival /
next_iteration on it (`EngineSimulation`, engines/protocol.py). Without data
parallelism there is one instance and its batches run through the pipeline; with DP
ranks (dataparallel.py) each rank is an instance with its own queue, running requests
and KV pool (docs/engines.md §8). Launching, CPU time and the request bookkeeping that
outlives an instance (the run's load, evictions) go through the simulation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Protocol

import simpy

from ..engines.batches import MicroBatch, Request
from ..engines.protocol import EngineScheduler

if TYPE_CHECKING:
    from ..costs.host import HostCosts


class Backend(Protocol):
    """Where an instance's batches run: the pipeline, or the DP ranks' processes."""

    iteration: int  # the first rank's current slot iteration (SGLang PP; -1 without)

    def launch(self, mb: MicroBatch) -> None: ...

    def next_iteration(self) -> None: ...


class Host(Protocol):
    """What an instance asks of the simulation that holds it (simulation.py)."""

    cpu_iteration_s: float
    host: HostCosts

    # read-only here: the simulation's own are of narrower types (its counting
    # environment, its one back end)
    @property
    def env(self) -> simpy.Environment: ...

    @property
    def backend(self) -> Backend: ...

    def admit(self, req: Request) -> None: ...

    def evicted(self, req: Request) -> None: ...

    def launch(self, slot: int, decode: list, prefill: list, instance: EngineInstance) -> MicroBatch: ...

    def cpu(self, seconds: float) -> Generator[simpy.Event, None, None]: ...

    def charge(self, parts: Sequence[tuple[str, float]]) -> Generator[simpy.Event, None, None]: ...


class EngineInstance:
    """An engine instance's queue, running count and KV pool (EngineSimulation)."""

    def __init__(self, sim: Host, index: int, kv_tokens: int, pp: int) -> None:
        self.sim, self.index, self.pp = sim, index, pp
        self.waiting: deque[Request] = deque()  # arrived, not yet admitted
        self.running = 0  # admitted, not finished
        self.kv_free = kv_tokens
        self.cpu_iteration_s = sim.cpu_iteration_s
        self.host = sim.host
        self.scheduler: EngineScheduler | None = None
        self.idle = False  # its scheduler waits for an arrival: nothing to run or form
        self.on_idle: Callable[[], None] = _nothing  # who wants to know (the DP lock step)
        self._arrival = sim.env.event()

    def admit(self, req: Request) -> None:
        """The engine takes a waiting request; it takes KV memory itself as it forms
        batches (engines/kv.py). An evicted request prefills its prompt and the outputs
        it had (recompute)."""
        self.sim.admit(req)
        self.running += 1

    def requeue(self, req: Request, front: bool) -> None:
        """The engine evicts a running request to free KV (SGLang retract_decode, vLLM
        recompute preemption; docs/engines.md §4): its memory goes back to the pool and
        it waits again, at the front (vLLM) or the back (SGLang) of the queue."""
        self.kv_free += req.kv_reserved
        req.kv_reserved = 0
        req.evicted += 1
        req.queued = self.waiting
        self.sim.evicted(req)
        self.running -= 1
        if front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def launch(self, slot: int, decode: list, prefill: list) -> MicroBatch:
        """Hand a formed micro-batch to the instance's GPUs."""
        return self.sim.launch(slot, decode, prefill, self)

    def cpu(self, seconds: float) -> Generator[simpy.Event, None, None]:
        """Scheduler CPU time (a generator to `yield from`)."""
        return self.sim.cpu(seconds)

    def charge(self, parts: Sequence[tuple[str, float]]) -> Generator[simpy.Event, None, None]:
        """The engine loop's CPU by part (Simulation.charge)."""
        return self.sim.charge(parts)

    def next_iteration(self) -> None:
        """The first rank starts its next slot iteration (SGLang PP; pipeline.py)."""
        self.sim.backend.next_iteration()

    def enqueue(self, req: Request) -> None:
        """The front end hands the instance a request."""
        self.waiting.append(req)
        self.idle = False
        if not self._arrival.triggered:
            self._arrival.succeed()

    def wait_arrival(self) -> simpy.Event:
        """An event that fires at the next arrival (the scheduler's idle wait)."""
        if self._arrival.triggered:
            self._arrival = self.sim.env.event()
        self.idle = True
        self.on_idle()
        return self._arrival


def _nothing() -> None:
    pass

"""What an engine and the simulation may ask of each other, declared.

An engine's launch flags as given are its `EngineConfig` (each field a knob declared in
engines/knobs.py), which the scenario validates and resolves to `EngineSettings`. An
engine's scheduler reads the waiting queue, the running count and the free KV
tokens, and calls admit / launch / cpu / wait_arrival (`EngineSimulation`); the
simulation drives the scheduler's `run()` process and reports each returned
micro-batch with `on_return` (`EngineScheduler`); reports and the simulation ask
resolved settings only what `EngineSettings` declares, so every engine answers the
same questions under its own knob names.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import simpy

if TYPE_CHECKING:
    from dataclasses import Field

    from ..costs.host import HostCosts
    from ..inputs.box import Box
    from ..inputs.memory import MemoryRule
    from ..inputs.model import Model
    from ..inputs.plan import Plan
    from .batches import MicroBatch, Request
    from .releases import HostRules
    from .routing import RankLoad


class EngineSimulation(Protocol):
    """The part of the Simulation an engine scheduler may use."""

    waiting: deque[Request]  # arrived, not yet admitted, in arrival order
    running: int  # admitted, not finished
    kv_free: int  # KV-cache tokens no request holds (engines take them as batches form)
    cpu_iteration_s: float  # the profile's own extra scheduler CPU per iteration
    host: HostCosts  # the host loop's terms: what the engine loop's CPU costs (costs/host.py)
    pp: int  # pipeline stages the batches run through (1 for a DP rank)

    def next_iteration(self) -> None: ...  # the first rank starts its next slot iteration (SGLang PP)

    def admit(self, req: Request) -> None: ...

    def requeue(self, req: Request, front: bool) -> None: ...  # evict for KV (engines/kv.py)

    def launch(self, slot: int, decode: list, prefill: list) -> MicroBatch: ...

    def cpu(self, seconds: float) -> Generator[simpy.Event, None, None]: ...

    # the engine loop's CPU, by part (scheduler, input_prep, broadcast, output_step, launch)
    def charge(self, parts: Sequence[tuple[str, float]]) -> Generator[simpy.Event, None, None]: ...

    def wait_arrival(self) -> simpy.Event: ...


class EngineScheduler(Protocol):
    """An engine's scheduler loop, as the simulation drives it."""

    def run(self) -> Generator[simpy.Event, object, None]: ...

    def on_return(self, mb: MicroBatch, finished: list[Request]) -> None: ...


class EngineSettings(Protocol):
    """An engine's knobs resolved to the values it would run with."""

    @property
    def slots(self) -> int: ...  # micro-batch slots the scheduler cycles (1: none)

    @property
    def kv_tokens(self) -> int: ...

    @property
    def running_cap(self) -> int: ...  # the most requests admitted at once

    @property
    def slot_cap(self) -> int: ...  # the most requests one micro-batch slot runs (0: no per-slot cap)

    @property
    def async_depth(self) -> int: ...  # iterations the last PP rank holds a batch's outputs (SGLang)

    @property
    def inflight_groups(self) -> int: ...  # batches in flight whose requests form groups (vLLM); 0: slots

    @property
    def in_flight(self) -> int: ...  # the most batches launched and not yet back at once

    @property
    def prefill_budget(self) -> int: ...  # prompt tokens one batch takes at most

    @property
    def mixes_prefill(self) -> bool: ...  # prompt chunks ride with decodes in one batch (vLLM)

    @property
    def batches_per_request(self) -> int: ...  # batches in flight one request may ride at once

    @property
    def host(self) -> HostRules: ...  # how the release runs and hides its host loop (releases.py)

    def describe(self) -> dict: ...

    def graphed(self, decode: int, prefill_tokens: int) -> bool: ...

    def graph_tokens(self, decode: int, prefill_tokens: int) -> int: ...  # padded size; 0: eager

    def scheduler(self, sim: EngineSimulation) -> EngineScheduler: ...

    def router(self, dp: int) -> DPRouter: ...  # the front end's rule over dp ranks (routing.py)


class DPRouter(Protocol):
    """Which data-parallel rank an arriving request goes to (routing.py)."""

    def route(self, now_s: float, ranks: Sequence[RankLoad]) -> int: ...


class EngineConfig(Protocol):
    """An engine's launch flags as given (its fields, each a knob: engines/knobs.py), and
    the engine's rules that resolve them. The scenario asks nothing else of it."""

    name: ClassVar[str]  # ENGINES key, the engine of a profile
    title: ClassVar[str]  # the engine's own spelling, for help texts and docs
    partition_rule: ClassVar[str]  # how it splits layers over PP stages (inputs/plan.py)
    running_cap_knob: ClassVar[str]  # the knob that caps the running requests
    prefill_chunk_knob: ClassVar[str]  # the knob that sets a batch's prompt tokens
    # knob -> the knobs the engine derives from it when they are not given: a profile's
    # deployment value for them yields once the user gives the source knob
    derived_from: ClassVar[Mapping[str, tuple[str, ...]]]
    # a frozen dataclass: a search changes its knobs with dataclasses.replace (explore/screen.py)
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def validate(self) -> None: ...  # every knob within its declaration; UserError otherwise

    def memory_fraction(self, gpu_memory_bytes: float, tp: int, pp: int) -> float: ...

    # how the engine sizes its KV pool at `version` (engines/reserve.py; "": not known)
    def memory_rule(self, box: Box, plan: Plan, model: Model, version: str) -> MemoryRule: ...

    # `version`: the engine release (its host-loop rules; None: the newest modelled)
    def resolve(
        self, gpu_memory_bytes: float, plan: Plan, model: Model, kv_tokens: int, version: str | None = None
    ) -> EngineSettings: ...

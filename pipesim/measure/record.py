"""What one run recorded: busy intervals, launched batches and returned tokens.

The simulation appends rows to a `Recorder` while it runs (plain list appends of
small named tuples: the recorder sits on the simulator's hot path); tally.py folds
them into running figures as the run goes, and the finished run is a frozen `Record`
that metrics.py and trace.py read. Nothing downstream reads the Simulation itself, so
a metric can be checked on a Record built by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappush
from typing import TYPE_CHECKING, NamedTuple

import simpy
from simpy.events import NORMAL, Event

from .request_tally import RequestTally
from .tally import StepTally

if TYPE_CHECKING:
    from collections.abc import Callable


class Interval(NamedTuple):
    """A stretch of time a resource was busy (or a transfer waited).

    The simulation appends interval rows as plain `(start_s, end_s)` tuples: they are
    the most frequent rows and building a NamedTuple costs ten times a tuple literal
    (README Performance). An Interval is a tuple, so both read the same way
    (unpacking, numpy arrays); hand-built records may use either."""

    start_s: float
    end_s: float


class Batch(NamedTuple):
    """A micro-batch as the engine launched it."""

    launch_s: float
    slot: int
    requests: int
    kind: str  # "decode", "prefill" or "mixed"


class TokenReturn(NamedTuple):
    """Sampled tokens back on the first stage."""

    time_s: float
    tokens: int


def hop_name(stage: int, stages: int) -> str:
    """The name of the PP hop out of `stage` (from the last stage: back to stage 0)."""
    return f"stage{stage}->stage{(stage + 1) % stages}"


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules: the simulator's cost
    (physics.md §8), reported as `sim_events`.

    `schedule` is SimPy's own (simpy 4, core.py `Environment.schedule`) with the
    count as the tie-breaking event id: ids increase exactly as SimPy's do, so the
    event order is unchanged, and the count costs no extra call per event."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event: simpy.Event, priority: int = NORMAL, delay: float = 0) -> None:
        self.scheduled = n = self.scheduled + 1
        heappush(self._queue, (self._now + delay, priority, n, event))

    def call_at(self, t: float, callback: Callable[[simpy.Event], object]) -> None:
        """Run `callback(event)` at simulated time `t`: one event, as
        `timeout(t - now).callbacks.append(callback)` schedules it (the same time, to
        the bit, and the same order), without a Timeout's construction: nothing waits
        on it."""
        ev = Event.__new__(Event)
        ev.env, ev.callbacks, ev._value, ev._ok = self, [callback], None, True
        self.scheduled = n = self.scheduled + 1
        heappush(self._queue, (self._now + (t - self._now), NORMAL, n, ev))


class Recorder:
    """The rows of a run in progress, appended once each, each at or before its start
    (tally.py folds them as the run goes). Per-stage lists are indexed by stage; hops
    are per stage too (the hop out of that stage)."""

    __slots__ = ("compute", "comm", "hops", "cpu", "tokens", "batches", "link_wait", "evictions", "kv_free")

    def __init__(self, stages: int) -> None:
        self.compute: list[list[Interval]] = [[] for _ in range(stages)]
        self.comm: list[list[Interval]] = [[] for _ in range(stages)]  # TP collectives
        self.hops: list[list[Interval]] = [[] for _ in range(stages)]  # hop out of each stage
        self.cpu: list[Interval] = []  # scheduler CPU on the first stage
        self.tokens: list[TokenReturn] = []
        self.batches: list[Batch] = []
        self.link_wait: list[Interval] = []  # waits for a shared PCIe link
        # (time_s, rid): a running request evicted for KV (SGLang retract, vLLM preempt)
        self.evictions: list[tuple[float, int]] = []
        self.kv_free: list[tuple[float, int]] = []  # (launch_s, KV tokens free), per batch

    def clip(self, end_s: float) -> None:
        """Cut the rows at the run's stop: work booked to start after it was never
        reached; work under way at the stop ends there (a kept record, the trace)."""
        for rows in (*self.compute, *self.comm, *self.hops, self.cpu, self.link_wait):
            rows[:] = [(a, b if b <= end_s else end_s) for a, b in rows if a < end_s]

    def freeze(
        self,
        *,
        stage_gpus: tuple[tuple[int, ...], ...],
        layers_per_stage: tuple[int, ...],
        slots: int,
        groups: int = 0,
        clients: int | None,
        window_start_s: float | None,
        end_s: float,
        events: int,
        engine_load: float | None = None,
        dp: int = 1,
        steps: StepTally | None = None,
        requests: RequestTally | None = None,
        keep_rows: bool = True,
        period: tuple[int, int] | None = None,
    ) -> Record:
        """The finished run as a value. The rows not yet folded into `steps` (all of
        them, for a record built by hand) are folded now, over the window
        [window_start_s, end_s] (None: the run never reached its window). With
        `keep_rows` the rows stay, cut at the stop (`clip`), and are handed over, not
        copied. With data parallelism (dp > 1, pp = 1) the rows are the DP ranks and
        there are no hops."""
        pp = len(stage_gpus)
        if steps is None:
            steps = StepTally(len(self.compute), slots, groups if dp == 1 else 0, open_loop=clients is None)
        steps.fold(self, end_s, window_start_s, final=True, drop=not keep_rows)
        if keep_rows:
            self.clip(end_s)
        names = tuple(hop_name(s, pp) for s in range(pp)) if pp > 1 and dp == 1 else ()
        return Record(
            compute=tuple(self.compute),
            comm=tuple(self.comm),
            hops={n: self.hops[s] for s, n in enumerate(names)},
            hop_names=names,
            cpu=self.cpu,
            tokens=self.tokens,
            batches=self.batches,
            link_wait=self.link_wait,
            evictions=self.evictions,
            kv_free=self.kv_free,
            stage_gpus=stage_gpus,
            layers_per_stage=layers_per_stage,
            slots=slots,
            groups=groups,
            clients=clients,
            window_s=steps.window_s,
            end_s=end_s,
            events=events,
            engine_load=engine_load,
            dp=dp,
            steps=steps,
            requests=requests if requests is not None else RequestTally(closed=clients is not None),
            kept=keep_rows,
            period=period,
        )


@dataclass(frozen=True)
class Record:
    """What one finished run recorded, and the run's shape needed to read it: its
    figures (`steps`, `requests`) and, for a kept record (`kept`: the trace), every
    row; a summary record's row lists are empty."""

    compute: tuple[list[Interval], ...]  # per stage
    comm: tuple[list[Interval], ...]  # per stage: TP collectives
    hops: dict[str, list[Interval]]  # hop name -> its transfers (empty without PP)
    hop_names: tuple[str, ...]  # per stage: the hop out of it (empty without PP)
    cpu: list[Interval]
    tokens: list[TokenReturn]
    batches: list[Batch]
    link_wait: list[Interval]
    stage_gpus: tuple[tuple[int, ...], ...]  # per stage: its TP group
    layers_per_stage: tuple[int, ...]
    slots: int  # micro-batch slots of the engine (1: none)
    clients: int | None  # closed-loop concurrency (None: open loop or trace)
    window_s: tuple[float, float]  # the measurement window
    end_s: float  # simulated time at the end of the run
    events: int  # events the simulation scheduled
    steps: StepTally  # the rows' figures over the window (tally.py)
    requests: RequestTally  # the finished requests' rows and figures (request_tally.py)
    # closed loop with more clients than the engine admits: the mean number of admitted
    # requests over the window (None: every client's request is admitted at once)
    engine_load: float | None = None
    dp: int = 1  # data-parallel ranks: with dp > 1 the per-stage rows are the ranks (pp = 1)
    # running requests evicted for KV, (time_s, rid) (SGLang retract_decode, vLLM preemption)
    evictions: list = field(default_factory=list)
    kv_free: list = field(default_factory=list)  # (launch_s, KV-cache tokens free) per batch
    # vLLM: batches in flight (max_concurrent_batches); the i-th launched batch is in
    # group i mod groups (0: the engine has micro-batch slots instead)
    groups: int = 0
    kept: bool = True  # every row kept (the trace); False: folded as the run went
    # (P, shift): the window is whole periods of P requests of a run that repeats, its
    # slot labels moved on by `shift` each period (steady.period; None: no period seen)
    period: tuple[int, int] | None = None

    @property
    def pp(self) -> int:
        """Rows of the per-stage lists: the pipeline stages, or the DP ranks."""
        return len(self.stage_gpus)

    @property
    def tp(self) -> int:
        return len(self.stage_gpus[0])

    def inbound_hop(self, stage: int) -> str | None:
        """The hop whose arrival feeds `stage`: from the stage before, or for stage 0
        the sampled tokens coming back from the last stage (None without PP)."""
        return self.hop_names[(stage - 1) % self.pp] if self.hop_names else None

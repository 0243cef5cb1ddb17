"""The discrete-event simulation (SimPy): requests, micro-batches, the engine's loop.

The engine's scheduler (engines/) runs as a SimPy process on the first stage: it
admits requests, forms micro-batches and hands them to the pipeline (pipeline.py:
stages, links and hops, booked as free-at clocks), then waits for their outputs to
come back (`MicroBatch.returned`) and updates the requests. Data parallelism
(dataparallel.py) runs its ranks in place of the pipeline. `Request` and `MicroBatch`
themselves are batches.py's.

Every busy interval is recorded once in a `Recorder` (record.py), and every finished
request in a `RequestTally` (request_tally.py). With `record="summary"` (what a
prediction needs) the rows are folded into running figures as the run goes
(tally.py) and let go, and an open loop keeps no request, so memory stays flat in the
run's length; `record="full"` keeps every row and request (the trace, tests).
`Simulation.record()` hands the finished run to metrics.py and trace.py as a frozen
`Record`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator

import numpy as np
import simpy

from ..costs.stage import CostModel
from ..engines.batches import MicroBatch, Request
from ..engines.protocol import EngineScheduler, EngineSettings, EngineSimulation
from ..inputs.workload import ArrivalPlan, Workload
from ..measure.record import Record, fold, freeze
from ..measure.request_tally import RequestTally
from ..measure.rows import Batch, Recorder, TokenReturn
from ..measure.steady import closed_loop_ci, period
from ..measure.tally import FOLD_RETURNS, StepTally
from .env import CountingEnvironment
from .pipeline import Pipeline

RECORD_MODES = ("summary", "full")


class Channel:
    """A FIFO hand-off between processes (data parallelism's ranks, dataparallel.py).
    Cheaper than `simpy.Store`: a put costs no event, a take costs one only when the
    taker has to wait (physics.md §8: events per simulated step decide the
    simulator's speed)."""

    __slots__ = ("env", "items", "waiter")

    def __init__(self, env: simpy.Environment):
        self.env, self.items, self.waiter = env, deque(), None

    def put(self, item: object) -> None:
        self.items.append(item)
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter.succeed()

    def wait(self) -> simpy.Event:
        self.waiter = self.env.event()
        return self.waiter


class Simulation:
    """The request bookkeeping an engine scheduler drives, and its pipeline (pipeline.py)."""

    # a repeating closed loop stops at a whole period (_steady): its rows say every label
    # a figure is kept by (the slot); data parallelism's ranks are not in them
    stops_at_periods = True

    def __init__(
        self,
        costs: CostModel,
        workload: Workload,
        engine_factory: Callable[[EngineSimulation], EngineScheduler],
        settings: EngineSettings,
        warmup_requests: int,
        measure_requests: int,
        max_measure_requests: int | None = None,
        ci_target: float | None = None,
        queued: bool = False,
        record: str = "full",
    ):
        if record not in RECORD_MODES:
            raise ValueError(f"record must be one of {', '.join(RECORD_MODES)}, got {record!r}")
        self.env = env = CountingEnvironment()
        self.costs, self.workload, self.settings = costs, workload, settings
        plan = costs.plan
        self.pp = plan.pp
        self.rec = Recorder(plan.pp)
        self.rng = np.random.default_rng(workload.seed)
        self.waiting: deque[Request] = deque()
        self.full = record == "full"
        self.requests: list[Request] | None = [] if self.full else None  # kept by a full record only
        self.arrived = 0
        closed = workload.kind == "closed"
        # an open loop's arrival times, drawn before any request length (workload.py)
        self.arrivals = None if closed else ArrivalPlan(workload, self.rng)
        self.done = RequestTally(
            closed=closed, keep_rows=self.full, arrivals_s=None if closed else self.arrivals.span_s
        )
        self.kv_free = settings.kv_tokens
        self.running = 0  # admitted, not finished
        self.completed = 0
        # Stop after warm-up + measure_requests completions if no CI target is set;
        # with one, keep measuring until the throughput's 95% half-width is within
        # ci_target of its mean, or max_measure_requests have completed.
        self.target = warmup_requests + measure_requests
        self.cap = warmup_requests + max(max_measure_requests or measure_requests, measure_requests)
        self.ci_target = ci_target
        # A closed loop with more clients than the engine admits keeps a queue: its
        # throughput is then estimated on the admitted requests (steady.py).
        self.queued = queued and workload.kind == "closed"
        self._load_s = self._load_t = self._load_warm_s = 0.0  # integral of `running` over time
        self._check_every = max(1, measure_requests // 8)
        self._stop_measured: int | None = None  # a repeating run's whole periods (_steady)
        # (P, slot shift): the run stopped at whole periods of P requests (_steady)
        self.period: tuple[int, int] | None = None
        self.warmup_requests = warmup_requests
        # the measurement window's start: the warm-up's end (None until then)
        self.window_start_s = None if closed and warmup_requests > 0 else 0.0
        self.stop = env.event()
        self._arrival = env.event()
        params = costs.params
        self.cpu_iteration_s = params.cpu_iteration_ms * 1e-3
        self._frontend_s = params.frontend_ms * 1e-3
        self._frontend_free_s = 0.0
        # the output path (detokenizer, one process): per returned step and per token in it
        self._detok_step_s, self._detok_token_s = (
            params.detokenize_step_us * 1e-6,
            params.detokenize_token_us * 1e-6,
        )
        self._detok_free_s = 0.0
        self.pipe = Pipeline(
            env,
            costs,
            self.rec,
            depth=settings.async_depth,
            cpu_iteration_s=self.cpu_iteration_s,
            cpu_hop_s=params.cpu_hop_ms * 1e-3,
            complete=lambda mb: self._complete(mb),  # looked up per call: tests wrap it
        )
        self._free_at = self.pipe._free_at  # the links' free-at times (DP replicas add theirs)
        self.inbox: list[Channel] | None = None  # data parallelism's rank inboxes
        self._seq = 0
        self._start(engine_factory)
        self.pipe.rec = self.rec  # the recorder _start settled on (DP: a row per rank)
        self.tally = StepTally(
            len(self.rec.compute),
            settings.slots,
            settings.inflight_groups if self.inbox is None else 0,
            open_loop=not closed,
        )
        env.process(self._arrivals())

    def _start(self, engine_factory: Callable[[EngineSimulation], EngineScheduler]) -> None:
        """The engine's scheduler on the pipeline (data parallelism starts its ranks
        instead: dataparallel.py)."""
        self.scheduler = engine_factory(self)
        self.env.process(self.scheduler.run())

    def _book(self, links: tuple, seconds: float) -> tuple[float, float]:
        """Occupy `links` for `seconds` from now, first come first served
        (`Pipeline._book`; data parallelism's replicas book their rings here)."""
        return self.pipe._book(links, self.env.now, seconds)

    def next_iteration(self) -> None:
        """The first rank starts its next slot iteration (SGLang PP; pipeline.py)."""
        self.pipe.next_iteration()

    # ---- requests ---------------------------------------------------------------------
    def launch(self, slot: int, decode: list, prefill: list, rank: int = 0) -> MicroBatch:
        """The engine hands a formed micro-batch to the first stage (of its DP rank)."""
        prefill_tokens = sum(c for _, c, _ in prefill)
        graphed = self.settings.graphed(len(decode), prefill_tokens)
        pad = (
            max(self.settings.graph_tokens(len(decode), prefill_tokens) - len(decode) - prefill_tokens, 0)
            if graphed
            else 0
        )
        mb = MicroBatch(self._seq, slot, decode, prefill, self.env, graphed, pad)
        self._seq += 1
        for r in decode:
            r.inflight += 1
        for r, _, _ in prefill:
            r.inflight += 1
        self.rec.batches.append(
            Batch(
                self.env.now,
                slot,
                mb.size,
                "decode" if not prefill else ("prefill" if not decode else "mixed"),
            )
        )
        if self.inbox is None:  # one KV pool (DP ranks keep their own)
            self.rec.kv_free.append((self.env.now, self.kv_free))
        mb.it, mb.rank = self.pipe.iteration, rank
        if self.inbox is None:
            self.pipe.launch(mb)
        else:
            self.inbox[rank].put(mb)
        return mb

    def cpu(self, seconds: float) -> Generator[simpy.Event, None, None]:
        """Scheduler CPU time on the first stage (a generator to `yield from`),
        recorded as it starts (tally.py: every row at or before its start)."""
        if seconds > 0:
            t0 = self.env.now
            self.rec.cpu.append((t0, t0 + seconds))
            yield self.env.timeout(seconds)

    def admit(self, req: Request) -> None:
        """The engine takes a waiting request; it schedules the KV memory itself as it
        forms batches (engines/kv.py). An evicted request prefills its prompt and the
        outputs it had (recompute)."""
        req.queued = None
        req.prefilled = req.scheduled = 0
        req.prefill_len = req.input_len + req.generated
        self._count_load()
        self.running += 1
        if req.admit_s < 0:
            req.admit_s = self.env.now

    def requeue(self, req: Request, front: bool, pool: EngineSimulation | None = None) -> None:
        """The engine evicts a running request to free KV (SGLang retract_decode, vLLM
        recompute preemption; docs/engines.md §4): its memory goes back to the pool and
        it waits again, at the front (vLLM) or the back (SGLang) of the queue. `pool`:
        the engine's view when it is not this simulation (a DP rank)."""
        pool = self if pool is None else pool
        pool.kv_free += req.kv_reserved
        req.kv_reserved = 0
        req.evicted += 1
        req.queued = pool.waiting
        self._count_load()
        self.running -= 1
        if pool is not self:
            pool.running -= 1
        self.rec.evictions.append((self.env.now, req.rid))
        if front:
            pool.waiting.appendleft(req)
        else:
            pool.waiting.append(req)

    def _count_load(self) -> None:
        """Add the running count's time since its last change (the engine's load)."""
        now = self.env.now
        self._load_s += self.running * (now - self._load_t)
        self._load_t = now

    def _complete(self, mb: MicroBatch) -> list[Request]:
        """Sampled tokens are back on the first stage: update requests, free finished
        ones; returns them. `mb.returned` carries them to the engine: the pipeline
        triggers it at the return (its value is this return's), a DP rank here."""
        now = self.env.now
        if not self.full and len(self.rec.tokens) >= FOLD_RETURNS:
            fold(self.rec, self.tally, now, self.window_start_s)
        produced = 0
        finished = []
        for r, chunk, _ in mb.prefill:
            r.inflight -= 1
            r.prefilled += chunk
            if r.prefilled == r.prefill_len:
                r.generated += 1
                if r.first_token_s < 0:
                    r.first_token_s = now
                    self.done.first_token(now)
                produced += 1
                if r.generated == r.output_len:
                    finished.append(r)
        for r in mb.decode:
            r.inflight -= 1
            r.generated += 1
            produced += 1
            if r.generated == r.output_len:
                finished.append(r)
        self.rec.tokens.append(TokenReturn(now, produced))
        for r in finished:
            r.finish_s = now
            self.done.finish(r, self.window_start_s is not None and now > self.window_start_s)
            self.kv_free += r.kv_reserved
            self._count_load()
            if r.queued is not None:  # evicted while a batch carried it (vLLM): it leaves the queue
                r.queued.remove(r)
                r.queued = None
            else:
                self.running -= 1
            self.completed += 1
            if self.completed == self.warmup_requests:
                self.window_start_s = now
                self._load_warm_s = self._load_s
            if self.completed >= self.target and not self.stop.triggered and self._steady():
                self.stop.succeed()
        self.scheduler.on_return(mb, finished)
        if not mb.returned.triggered:
            mb.returned.succeed(finished)
        if self.workload.kind != "closed" or self.stop.triggered or not finished:
            return finished
        # a client sends its next request once its response has fully arrived: after the
        # detokenizer has handled this step's outputs (one process, serial; docs/engines.md §1)
        if self._detok_step_s or self._detok_token_s:
            done = self._detok_free_s = (
                max(now, self._detok_free_s) + self._detok_step_s + self._detok_token_s * produced
            )
            self.env.call_at(done, lambda _ev, clients=[r.client for r in finished]: self._resend(clients))
            return finished
        for r in finished:
            self._arrive(r.client)
        return finished

    def _resend(self, clients: list) -> None:
        if not self.stop.triggered:
            for c in clients:
                self._arrive(c)

    def _steady(self) -> bool:
        """Enough measured: no CI target, the cap reached, or the CI within target. A
        run whose requests repeat (steady.period) stops at the end of a whole period,
        so that every figure of its window, not only the throughput, is the long
        run's (a figure per slot once averaged over the slots' rotation, if any)."""
        if self.ci_target is None or self.completed >= self.cap:
            return True
        at_period = self._stop_measured is not None and self.done.measured >= self._stop_measured
        if not at_period and (self.completed - self.target) % self._check_every:
            return False
        self._stop_measured = None
        out, latency_s = self.done.closed_loop_sample(self.queued)
        per = self._period() if self.stops_at_periods else None
        mean, half = self._ci(out, latency_s, per[0] if per else 0)
        if not (mean > 0 and half <= self.ci_target * mean):
            return False
        if per is None:
            return True
        if len(out) % per[0] == 0:
            self.period = per
            return True
        self._stop_measured = (len(out) // per[0] + 1) * per[0]
        return False

    def _period(self) -> tuple[int, int] | None:
        """The measured requests' period and slot rotation (steady.period), on every
        time a request's figures read, its slot and its output."""
        rows = self.done.rows()
        start = rows["arrival_s"]
        times = np.column_stack([rows[c] - start for c in ("admit_s", "first_token_s", "finish_s")])
        return period(rows["output_len"], times, rows["slot"], self.settings.slots)

    def _ci(self, out: np.ndarray, latency_s: np.ndarray, period_requests: int) -> tuple[float, float]:
        """Closed-loop output rate and its 95% half-width from the measured requests."""
        return closed_loop_ci(
            self.engine_load() if self.queued else self.workload.concurrency, out, latency_s, period_requests
        )

    def engine_load(self) -> float:
        """Mean number of admitted requests over the measurement window so far."""
        self._count_load()
        span = self.env.now - (self.window_start_s or 0.0)
        return (self._load_s - self._load_warm_s) / span if span > 0 else float("nan")

    def _arrive(self, client: int = -1, input_len: int | None = None, output_len: int | None = None) -> None:
        w = self.workload
        if input_len is None:
            input_len = int(w.input_len.sample(self.rng, 1)[0])
            output_len = int(w.output_len.sample(self.rng, 1)[0])
        req = Request(self.arrived, self.env.now, input_len, output_len, client)
        self.arrived += 1
        if self.requests is not None:
            self.requests.append(req)
        self.done.arrival(req.arrival_s)
        if self._frontend_s <= 0:
            self._enqueue(req)
            return
        # the engine's front end (tokenizer, IPC) handles requests one at a time
        done = self._frontend_free_s = max(self.env.now, self._frontend_free_s) + self._frontend_s
        self.env.call_at(done, lambda _ev, req=req: self._enqueue(req))

    def _enqueue(self, req: Request) -> None:
        """The request reaches the scheduler's waiting queue."""
        self.waiting.append(req)
        if not self._arrival.triggered:
            self._arrival.succeed()

    def wait_arrival(self) -> simpy.Event:
        """An event that fires at the next arrival (the engine's idle wait)."""
        if self._arrival.triggered:
            self._arrival = self.env.event()
        return self._arrival

    def _arrivals(self) -> Generator[simpy.Event, None, None]:
        w, env = self.workload, self.env
        if w.kind == "closed":
            for c in range(w.concurrency):
                self._arrive(c)
            return
        if w.kind == "poisson":
            for gap in self.arrivals.gaps():
                yield env.timeout(gap)
                self._arrive()
            return
        for arrival_s, n_in, n_out in w.trace:
            if arrival_s > env.now:  # ArrivalPlan adds the times up the same way
                yield env.timeout(arrival_s - env.now)
            self._arrive(-1, n_in, n_out)

    def run(self, max_sim_s: float) -> None:
        """Run until the stopping rule fires (or `max_sim_s`, a guard against a
        scenario that cannot make progress)."""
        self.env.run(until=simpy.AnyOf(self.env, [self.stop, self.env.timeout(max_sim_s)]))

    def record(self) -> Record:
        """The finished run as a value: what metrics.py and trace.py read. The last
        stretch of rows is folded (tally.py); a full record keeps its rows, cut at the
        stop."""
        plan = self.costs.plan
        return freeze(
            self.rec,
            stage_gpus=tuple(tuple(plan.stage_gpus(s)) for s in range(plan.pp)),
            layers_per_stage=tuple(plan.layers_per_stage),
            slots=self.settings.slots,
            groups=self.settings.inflight_groups,
            clients=self.workload.concurrency if self.workload.kind == "closed" else None,
            window_start_s=self.window_start_s,
            end_s=self.env.now,
            events=self.env.scheduled,
            engine_load=self.engine_load() if self.queued else None,
            steps=self.tally,
            requests=self.done,
            keep_rows=self.full,
            period=self.period,
        )

"""The discrete-event simulation (SimPy): one run, composed of its parts.

- the front end (frontend.py): arrivals, the tokenizer, routing over DP ranks, the
  detokenizer;
- the engine instances (instance.py): the engine's scheduler (engines/) runs as a
  SimPy process per instance, reads its queue, running count and KV pool, and forms
  micro-batches; one instance, or one per DP rank;
- the back end where their batches run: the pipeline (pipeline.py: stages, hops and
  links, booked as free-at clocks) or the DP ranks (dataparallel.py: independent
  replicas or lock-step steps), booking shared links on one `Links` (links.py);
- the request lifecycle (here): admission and eviction counts, the outputs coming back
  (`complete`), KV given back, the run's load;
- the stopping rule (stopping.py), which owns the closed loop's sample, its confidence
  interval and the period it stops at.

Every busy interval is recorded once in a `Recorder` (measure/rows.py), and every
finished request in a `RequestTally` (measure/request_tally.py). With
`record="summary"` (what a prediction needs) the rows are folded into running figures
as the run goes (measure/tally.py) and let go, and an open loop keeps no request, so
memory stays flat in the run's length; `record="full"` keeps every row and request
(the trace, tests). `Simulation.record()` hands the finished run to the metrics and the
trace as a frozen `Record`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import simpy

from ..costs.host import hop_cpu_s
from ..costs.stage import CostModel
from ..engines.batches import MicroBatch, Request
from ..engines.protocol import EngineScheduler, EngineSettings, EngineSimulation
from ..inputs.workload import Workload
from ..measure.record import Record, fold, freeze
from ..measure.request_tally import RequestTally
from ..measure.rows import Batch, Recorder, TokenReturn
from ..measure.tally import FOLD_RETURNS, StepTally
from .dataparallel import LockStep, Replicas
from .env import CountingEnvironment
from .frontend import FrontEnd
from .instance import EngineInstance
from .links import Links
from .pipeline import Pipeline
from .stopping import StoppingRule

RECORD_MODES = ("summary", "full")


class Simulation:
    """One run: its front end, engine instances, back end, request lifecycle and
    stopping rule (module docstring)."""

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
        ranked: bool | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ):
        if record not in RECORD_MODES:
            raise ValueError(f"record must be one of {', '.join(RECORD_MODES)}, got {record!r}")
        self.env = env = CountingEnvironment()
        self.costs, self.workload, self.settings = costs, workload, settings
        plan = costs.plan
        self.dp = plan.dp
        # DP ranks, each an engine instance of its own (dataparallel.py); `ranked=True`
        # runs one rank that way too (a test of the DP machinery against the pipeline)
        self.ranked = plan.dp > 1 if ranked is None else ranked
        if self.ranked and plan.pp != 1:
            raise ValueError("data parallelism is simulated with pp = 1")
        self.full = record == "full"
        closed = workload.kind == "closed"
        params = costs.params
        self.cpu_iteration_s = params.cpu_iteration_ms * 1e-3
        self.host = costs.host  # the host loop's terms (costs/host.py)
        self.stop = env.event()
        self._stopping = False  # the stopping rule has fired (the stop follows the output path)
        self.frontend = FrontEnd(env, workload, params, self.stop)
        plan_s = self.frontend.plan
        self.done = RequestTally(  # an open loop's arrival plan: None for a closed loop
            closed=closed,
            keep_rows=self.full,
            arrivals_s=None if plan_s is None else plan_s.span_s,
            requests=measure_requests if workload.kind == "poisson" else 0,  # its stretches
        )
        self.running = 0  # admitted, not finished, over every instance
        self.completed = 0
        self.warmup_requests = warmup_requests
        # A closed loop with more clients than the engine admits keeps a queue: its
        # throughput is then estimated on the admitted requests (steady.py).
        queued = queued and closed
        self._load_s = self._load_t = self._load_warm_s = 0.0  # integral of `running` over time
        self.stopping = StoppingRule(
            warmup=warmup_requests,
            measure=measure_requests,
            max_measure=max_measure_requests,
            ci_target=ci_target,
            concurrency=workload.concurrency,
            queued=queued,
            slots=settings.slots,
            periodic=not self.ranked,
            load=self.engine_load,
        )
        self.queued = queued
        # told (requests finished, requests the run expects to need) as requests finish:
        # a progress bar's (api.py), kept out of the simulation's own state
        self.on_progress = on_progress
        # the measurement window's start: the warm-up's end (None until then)
        self.window_start_s = None if closed and warmup_requests > 0 else 0.0
        # rows per pipeline stage, or per DP rank
        self.rec = Recorder(self.dp if self.ranked else plan.pp)
        self.frontend.rows = self.rec.host
        self.links = Links(self.rec)
        self.instances = [EngineInstance(self, r, settings.kv_tokens, plan.pp) for r in range(self.dp)]
        self._seq = 0
        complete = lambda mb: self.complete(mb)  # noqa: E731 (looked up per call: tests wrap it)
        self.backend: Pipeline | LockStep | Replicas
        if not self.ranked:
            self.backend = Pipeline(
                env,
                costs,
                self.rec,
                self.links,
                depth=settings.async_depth,
                # every PP rank runs SGLang's slot loop (docs/engines.md §2); vLLM's stages
                # are workers that only relay (their metadata's CPU is in the hop)
                empty_iteration_s=costs.host.empty_s if settings.slots > 1 else None,
                cpu_hop_s=hop_cpu_s(params),
                complete=complete,
            )
        elif plan.moe_spans_dp:  # a MoE layer spans the ranks: they step together
            self.backend = LockStep(env, costs, self.rec, self.instances, complete)
        else:
            self.backend = Replicas(env, costs, self.rec, self.links, complete)
        for inst in self.instances:
            inst.scheduler = engine_factory(inst)
            env.process(inst.scheduler.run())
        self.tally = StepTally(
            len(self.rec.compute),
            settings.slots,
            0 if self.ranked else settings.inflight_groups,
            open_loop=not closed,
            positions=settings.in_flight,
        )
        router = settings.router(self.dp) if self.ranked else None
        self.frontend.start(self.instances, router, self.done.arrival, keep=self.full)

    @property
    def requests(self) -> list[Request] | None:
        """Every request of the run, by id (a full record only)."""
        return self.frontend.requests

    # ---- the request lifecycle --------------------------------------------------------
    def admit(self, req: Request) -> None:
        """An instance's engine takes a waiting request (EngineInstance.admit)."""
        req.queued = None
        req.prefilled = req.scheduled = 0
        req.prefill_len = req.input_len + req.generated
        self._count_load()
        self.running += 1
        if req.admit_s < 0:
            req.admit_s = self.env.now

    def evicted(self, req: Request) -> None:
        """An instance's engine evicted a running request for KV (EngineInstance.requeue)."""
        self._count_load()
        self.running -= 1
        self.rec.evictions.append((self.env.now, req.rid))

    def launch(self, slot: int, decode: list, prefill: list, inst: EngineInstance) -> MicroBatch:
        """An instance hands a formed micro-batch to the back end."""
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
        if not self.ranked:  # one KV pool (DP ranks keep their own)
            self.rec.kv_free.append((self.env.now, inst.kv_free))
        mb.it, mb.rank = self.backend.iteration, inst.index
        self.backend.launch(mb)
        return mb

    def cpu(self, seconds: float, part: str = "scheduler") -> Generator[simpy.Event, None, None]:
        """Scheduler CPU time on the first stage (a generator to `yield from`),
        recorded as it starts (tally.py: every row at or before its start)."""
        return self.charge(((part, seconds),))

    def charge(self, parts: Sequence[tuple[str, float]]) -> Generator[simpy.Event, None, None]:
        """The engine loop's CPU, part after part (rows.LOOP_PARTS), in one wait: each
        part a row of its own, all of them the loop's (`rec.cpu`)."""
        t0 = t = self.env.now
        cpu, host = self.rec.cpu, self.rec.host
        for part, seconds in parts:
            if seconds > 0:
                cpu.append((t, t + seconds))
                host[part].append((t, t + seconds))
                t += seconds
        if t > t0:
            yield self.env.timeout(t - t0)

    def _count_load(self) -> None:
        """Add the running count's time since its last change (the engine's load)."""
        now = self.env.now
        self._load_s += self.running * (now - self._load_t)
        self._load_t = now

    def complete(self, mb: MicroBatch) -> list[Request]:
        """Sampled tokens are back on the first stage: update requests, free finished
        ones; returns them. `mb.returned` carries them to the engine: the pipeline
        triggers it at the return (its value is this return's), the DP ranks here."""
        now = self.env.now
        inst = self.instances[mb.rank]
        if not self.full and len(self.rec.tokens) >= FOLD_RETURNS:
            fold(self.rec, self.tally, now, self.window_start_s)
        produced = len(mb.decode) + sum(1 for r, c, _ in mb.prefill if r.prefilled + c == r.prefill_len)
        # the clients see this step's tokens once the output path has handled them (frontend.py)
        seen = self.frontend.deliver(produced)
        finished = []
        for r, chunk, _ in mb.prefill:
            r.inflight -= 1
            r.prefilled += chunk
            if r.prefilled == r.prefill_len:
                r.generated += 1
                if r.first_token_s < 0:
                    r.first_token_s = seen
                    self.done.first_token(seen)
                if r.generated == r.output_len:
                    finished.append(r)
        for r in mb.decode:
            r.inflight -= 1
            r.generated += 1
            if r.generated == r.output_len:
                finished.append(r)
        self.rec.tokens.append(TokenReturn(now, produced))
        freed_kv = left = 0  # what the finished requests give back to their instance
        for r in finished:
            r.finish_s = seen
            self.done.finish(r, self.window_start_s is not None and seen > self.window_start_s)
            freed_kv += r.kv_reserved
            self._count_load()
            if r.queued is not None:  # evicted while a batch carried it (vLLM): it leaves the queue
                r.queued.remove(r)
                r.queued = None
            else:
                self.running -= 1
                left += 1
            self.completed += 1
            if self.completed == self.warmup_requests:  # the window runs between two clients' views
                self.window_start_s = seen
                self._load_warm_s = self._load_s
            if not self._stopping and self.stopping.done(self.completed, self.done):
                self._stopping = True  # the run ends when the client sees this completion
                if seen > now:
                    self.env.call_at(seen, self._stop_now)
                else:
                    self.stop.succeed()
        if finished and self.on_progress is not None:
            self.on_progress(self.completed, self.stopping.expected(self.completed))
        if not self.ranked:
            inst.kv_free += freed_kv
            inst.running -= left
        assert inst.scheduler is not None  # set as each instance is made (__init__)
        inst.scheduler.on_return(mb, finished)
        if not mb.returned.triggered:
            mb.returned.succeed(finished)
        if self.workload.kind == "closed" and not self._stopping and finished:
            self.frontend.respond(finished, seen)
        # A DP rank's counts change after a closed loop's next requests were routed on
        # them, its finished requests still counted at that instant. vLLM's engines
        # publish their counts after update_from_output drops finished requests, but
        # every 100 ms at most, and a client's next request arrives after its response
        # did: which instant the router sees is not settled; moving this changes the
        # balance (vLLM DP2 Qwen3-30B-A3B C=64: -7%), so it waits for a measurement.
        if self.ranked:
            inst.kv_free += freed_kv
            inst.running -= left
        return finished

    def _stop_now(self, _ev: simpy.Event) -> None:
        self.stop.succeed()

    def engine_load(self) -> float:
        """Mean number of admitted requests over the measurement window so far."""
        self._count_load()
        span = self.env.now - (self.window_start_s or 0.0)
        return (self._load_s - self._load_warm_s) / span if span > 0 else float("nan")

    # ---- running and the record ------------------------------------------------------
    def run(self, max_sim_s: float) -> None:
        """Run until the stopping rule fires (or `max_sim_s`, a guard against a
        scenario that cannot make progress)."""
        self.env.run(until=simpy.AnyOf(self.env, [self.stop, self.env.timeout(max_sim_s)]))

    def record(self) -> Record:
        """The finished run as a value: what the metrics and the trace read. The last
        stretch of rows is folded (tally.py); a full record keeps its rows, cut at the
        stop."""
        closed = self.workload.kind == "closed"
        load = self.engine_load() if self.queued else None
        return freeze(
            self.rec,
            stage_gpus=self.backend.stage_gpus,
            layers_per_stage=self.backend.layers_per_stage,
            slots=self.settings.slots,
            groups=self.settings.inflight_groups,
            clients=self.workload.concurrency if closed else None,
            window_start_s=self.window_start_s,
            end_s=self.env.now,
            events=self.env.scheduled,
            engine_load=load,
            dp=self.dp,
            steps=self.tally,
            requests=self.done,
            keep_rows=self.full,
            period=self.stopping.period,
            verdict=self.stopping.verdict(self.done) if closed else None,
        )

    def summary(self) -> dict:
        """What the DP ranks did (Result.data_parallel): requests routed to each, and in
        lock step the share of steps each rank ran a dummy batch in; empty with one."""
        backend = self.backend
        if isinstance(backend, Pipeline):  # not ranked
            return {}
        return {
            "ranks": self.dp,
            "lock_step": isinstance(backend, LockStep),
            "requests_per_rank": list(self.frontend.per_rank),
            **backend.summary(),
        }

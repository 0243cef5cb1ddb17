"""Data parallelism: DP ranks with their own schedulers (docs/engines.md §8).

SGLang `--dp-size N --enable-dp-attention` and vLLM `--data-parallel-size N` run one
scheduler per DP rank: its own waiting queue, running requests and KV pool, on its own
attention group of GPUs (`Plan.stage_gpus(0, r)`, pp = 1). A front end spreads requests
over the ranks by the engine's rule (`route`). Then either

- the ranks are independent replicas (a dense model; SGLang DP without DP attention):
  each rank's batches run on its own GPUs, its TP collectives on its own links; or
- the ranks step in lock step (a MoE model): one step takes every rank's next batch,
  a rank without one runs a dummy batch, and the step costs the slowest rank's own
  part plus the shared MoE layers (dpcosts.py).

`Rank` is what one rank's engine scheduler sees of the simulation (the
`EngineSimulation` protocol); `DPSimulation` replaces the pipeline of simulation.py
with the ranks and routes arrivals to them. Metrics read the ranks as the rows of the
per-stage lists (record.py, `Record.dp`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator

import simpy

from ..costs.dp import DPStepCosts
from ..engines.batches import MicroBatch, Request
from ..engines.protocol import EngineScheduler, EngineSimulation
from ..measure.record import Record
from ..measure.rows import Recorder
from .simulation import Channel, Simulation

# vLLM's DPCoordinator republishes the engines' [waiting, running] counts to the front
# end at most every 100 ms (coordinator.py, min_stats_update_interval_ms)
LB_REFRESH_S = 0.1
# DPLBAsyncMPClient.get_core_engine_for_request: score = waiting x 4 + running
LB_WAITING_WEIGHT = 4


class Rank:
    """One DP rank as its engine scheduler sees it (EngineSimulation): its own
    waiting queue, running count and KV pool; launching and CPU time go through the
    simulation."""

    def __init__(self, sim: DPSimulation, index: int, kv_tokens: int):
        self.sim, self.index = sim, index
        self.waiting: deque[Request] = deque()
        self.running = 0
        self.kv_free = kv_tokens
        self.cpu_iteration_s = sim.cpu_iteration_s
        self.pp = 1
        self._arrival = sim.env.event()
        self.idle = False  # its scheduler waits for an arrival: nothing to run or form
        self.scheduler: EngineScheduler | None = None

    def admit(self, req: Request) -> None:
        """Count the request in this rank and in the engine's load; the rank's engine
        takes its KV from this rank's pool as it forms batches (engines/kv.py)."""
        self.sim.admit(req)
        self.running += 1

    def launch(self, slot: int, decode: list, prefill: list) -> MicroBatch:
        return self.sim.launch(slot, decode, prefill, rank=self.index)

    def requeue(self, req: Request, front: bool) -> None:
        """Evict a running request for KV back into this rank's queue (engines/kv.py)."""
        self.sim.requeue(req, front, self)

    def cpu(self, seconds: float) -> Generator[simpy.Event, None, None]:
        return self.sim.cpu(seconds)

    def next_iteration(self) -> None:
        """No pipeline (pp = 1): nothing to release."""

    def enqueue(self, req: Request) -> None:
        self.waiting.append(req)
        self.idle = False
        if not self._arrival.triggered:
            self._arrival.succeed()

    def wait_arrival(self) -> simpy.Event:
        if self._arrival.triggered:
            self._arrival = self.sim.env.event()
        self.idle = True
        self.sim.ring()
        return self._arrival


class _Tap(Channel):
    """A rank's inbox that also wakes the lock-step process on any rank's put."""

    __slots__ = ("ring",)

    def __init__(self, env: simpy.Environment, ring: Callable[[], None]):
        super().__init__(env)
        self.ring = ring

    def put(self, item) -> None:
        self.items.append(item)
        self.ring()


class DPSimulation(Simulation):
    """The ranks, their schedulers and the processes that run their batches."""

    stops_at_periods = False  # per-rank figures: a period may hand work on to the next rank unseen

    def __init__(self, *args, dp: int, lockstep: bool, engine: str, **kwargs):
        self.dp, self.lockstep, self.engine = dp, lockstep, engine
        super().__init__(*args, **kwargs)

    def _start(self, engine_factory: Callable[[EngineSimulation], EngineScheduler]) -> None:
        env, plan, box = self.env, self.costs.plan, self.costs.box
        if plan.pp != 1:
            raise ValueError("data parallelism is simulated with pp = 1")
        self.rec = Recorder(self.dp)
        self.rank_gpus = tuple(plan.stage_gpus(0, r) for r in range(self.dp))
        self.ranks = [Rank(self, r, self.settings.kv_tokens) for r in range(self.dp)]
        self.dummy_steps = [0] * self.dp  # steps each rank ran a dummy batch in
        self.steps = 0  # lock-step steps run
        self.per_rank = [0] * self.dp  # requests routed to each rank
        # the rank each request went to, by request id (a full record only)
        self.routed: list[int] | None = [] if self.full else None
        self._rr = 0  # SGLang round-robin counter
        self._lb: list | None = None  # vLLM front end's [waiting, running] per rank
        self._lb_s = 0.0
        self._bell: simpy.Event | None = None
        if self.lockstep:
            self.inbox = [_Tap(env, self.ring) for _ in range(self.dp)]
            self.step_costs = DPStepCosts(self.costs, self.dp)
            env.process(self._lock_step())
        else:
            self.inbox = [Channel(env) for _ in range(self.dp)]
            self._rings = [box.ring_links(g) if len(g) > 1 else () for g in self.rank_gpus]
            for ring in self._rings:
                for d in ring:
                    self._free_at.setdefault(d, 0.0)
            for r in range(self.dp):
                env.process(self._replica(r))
        for rank in self.ranks:
            rank.scheduler = engine_factory(rank)
            env.process(rank.scheduler.run())

    # ---- routing ------------------------------------------------------------------
    def _enqueue(self, req: Request) -> None:
        """The front end hands the request to one rank (docs/engines.md §8)."""
        r = self.route()
        self.per_rank[r] += 1
        if self.routed is not None:
            self.routed.append(r)
        self.ranks[r].enqueue(req)

    def route(self) -> int:
        """SGLang DataParallelController round_robin; vLLM DPLBAsyncMPClient: the
        lowest waiting x 4 + running from the coordinator's counts (refreshed when
        LB_REFRESH_S old), first index on a tie, then one more waiting on the pick."""
        if self.engine == "sglang":
            r, self._rr = self._rr, (self._rr + 1) % self.dp
            return r
        now = self.env.now
        if self._lb is None or now - self._lb_s >= LB_REFRESH_S:
            self._lb = [[len(k.waiting), k.running] for k in self.ranks]
            self._lb_s = now
        lb = self._lb
        best = min(range(self.dp), key=lambda i: (LB_WAITING_WEIGHT * lb[i][0] + lb[i][1], i))
        lb[best][0] += 1
        return best

    # ---- running batches ----------------------------------------------------------
    def _replica(self, r: int) -> Generator[simpy.Event, None, None]:
        """An independent replica: as simulation.py's single stage, on rank r's GPUs."""
        env, stage_time = self.env, self.costs.stage_time
        inbox, items = self.inbox[r], self.inbox[r].items
        compute_log, comm_log, ring = self.rec.compute[r], self.rec.comm[r], self._rings[r]
        while True:
            if not items:
                yield inbox.wait()
            mb = items.popleft()
            compute_s, comm_s = stage_time(0, mb.shape)
            t0 = env.now
            compute_log.append((t0, t0 + compute_s))  # recorded as it starts (tally.py)
            yield env.timeout(compute_s)
            if comm_s:
                start, end = self._book(ring, comm_s)
                comm_log.append((start, end))
                yield env.timeout(end - env.now)
            self._complete(mb)

    def ring(self) -> None:
        """A rank launched a batch or went idle: the lock-step process looks again."""
        bell = self._bell
        if bell is not None:
            self._bell = None
            bell.succeed()

    def _ready(self) -> bool:
        """A step can start: some rank has a batch, and every rank has its next batch
        launched or waits for an arrival (the engines' batch-size sync waits for every
        rank's scheduler; a rank with nothing to run joins it at once)."""
        ranks = self.ranks
        return any(ch.items for ch in self.inbox) and all(
            ch.items or ranks[r].idle for r, ch in enumerate(self.inbox)
        )

    def _lock_step(self) -> Generator[simpy.Event, None, None]:
        """Every rank steps together: the next batch of each rank that has one, a
        dummy batch on the others (recorded as idle: padding, no request's work).
        A rank's own part runs from the step's start; the MoE layers start when the
        slowest rank's part ends."""
        env, inbox, rec = self.env, self.inbox, self.rec
        while True:
            while not self._ready():
                self._bell = env.event()
                yield self._bell
            mbs = [ch.items.popleft() if ch.items else None for ch in inbox]
            self.steps += 1
            parts, sync_s, moe_c, moe_a = self.step_costs.step([mb.shape if mb else None for mb in mbs])
            t0 = env.now
            t_moe = t0 + sync_s
            for r, part in enumerate(parts):
                if part is None:
                    self.dummy_steps[r] += 1
                else:
                    c, a = part
                    rec.compute[r].append((t0, t0 + c))
                    if a:
                        rec.comm[r].append((t0 + c, t0 + c + a))
                rec.compute[r].append((t_moe, t_moe + moe_c))
                if moe_a:
                    rec.comm[r].append((t_moe + moe_c, t_moe + moe_c + moe_a))
            yield env.timeout(sync_s + moe_c + moe_a)
            for mb in mbs:
                if mb is not None:
                    self._complete(mb)

    def _complete(self, mb: MicroBatch) -> None:
        """Sampled tokens are back: the rank's scheduler takes them, its KV and running
        count give back what the finished requests held."""
        rank = self.ranks[mb.rank]
        self.scheduler = rank.scheduler
        held = {r.rid: r.kv_reserved for r in mb.decode}
        held.update((r.rid, r.kv_reserved) for r, _, _ in mb.prefill)
        # requests the engine evicted while this batch carried them are no longer running
        evicted = {r.rid for r in mb.decode if r.queued is not None}
        evicted.update(r.rid for r, _, _ in mb.prefill if r.queued is not None)
        super()._complete(mb)
        finished = mb.returned.value
        if finished:
            rank.kv_free += sum(held[r.rid] for r in finished)
            rank.running -= sum(1 for r in finished if r.rid not in evicted)

    def summary(self) -> dict:
        """What the ranks did (Result.data_parallel): requests routed to each, and in
        lock step the share of steps each rank ran a dummy batch in."""
        out = {"ranks": self.dp, "lock_step": self.lockstep, "requests_per_rank": list(self.per_rank)}
        if self.lockstep:
            out["steps"] = self.steps
            out["dummy_step_share"] = [d / self.steps if self.steps else 0.0 for d in self.dummy_steps]
        return out

    def record(self) -> Record:
        rec = super().record()
        from dataclasses import replace

        return replace(
            rec, stage_gpus=self.rank_gpus, layers_per_stage=rec.layers_per_stage * self.dp, dp=self.dp
        )

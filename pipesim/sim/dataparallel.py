"""Data parallelism's back ends: where DP ranks' batches run (docs/engines.md §8).

SGLang `--dp-size N --enable-dp-attention` and vLLM `--data-parallel-size N` run one
scheduler per DP rank (an `EngineInstance` each: its own waiting queue, running
requests and KV pool, on its own attention group of GPUs, `Plan.stage_gpus(0, r)`,
pp = 1); the front end spreads requests over the ranks by the engine's rule
(engines/routing.py). Then either

- the ranks are independent replicas (`Replicas`: a dense model; SGLang DP without DP
  attention): each rank's batches run on its own GPUs, its TP collectives on its own
  links; or
- the ranks step in lock step (`LockStep`: a MoE model): one step takes every rank's
  next batch, a rank without one runs a dummy batch, and the step costs the slowest
  rank's own part plus the shared MoE layers (costs/dp.py).

Metrics read the ranks as the rows of the per-stage lists (`Record.dp`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import simpy

from ..costs.dp import DPStepCosts
from ..costs.stage import CostModel
from ..engines.batches import MicroBatch
from ..measure.rows import Recorder
from .env import Channel
from .instance import EngineInstance
from .links import Links


class _Ranks:
    """What both back ends share: one inbox per rank, the ranks' GPUs and layers."""

    iteration = -1  # no pipeline: no slot iterations

    def __init__(
        self, costs: CostModel, inbox: list[Channel], complete: Callable[[MicroBatch], object]
    ) -> None:
        plan = costs.plan
        self.costs, self.inbox, self._complete = costs, inbox, complete
        self.dp = plan.dp
        self.stage_gpus = tuple(plan.stage_gpus(0, r) for r in range(plan.dp))
        self.layers_per_stage = tuple(plan.layers_per_stage) * plan.dp

    def launch(self, mb: MicroBatch) -> None:
        self.inbox[mb.rank].put(mb)

    def next_iteration(self) -> None:
        """No pipeline (pp = 1): nothing to release."""

    def summary(self) -> dict:
        return {}


class Replicas(_Ranks):
    """Independent replicas: each rank as the pipeline's single stage, on its own GPUs."""

    def __init__(
        self,
        env: simpy.Environment,
        costs: CostModel,
        rec: Recorder,
        links: Links,
        complete: Callable[[MicroBatch], object],
    ) -> None:
        super().__init__(costs, [Channel(env) for _ in range(costs.plan.dp)], complete)
        self.env, self.rec, self.links = env, rec, links
        box = costs.box
        self._rings = [box.ring_links(g) if len(g) > 1 else () for g in self.stage_gpus]
        for ring in self._rings:
            links.add(ring)
        for r in range(self.dp):
            env.process(self._replica(r))

    def _replica(self, r: int) -> Generator[simpy.Event, None, None]:
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
                start, end = self.links.book(ring, env.now, comm_s)
                comm_log.append((start, end))
                yield env.timeout(end - env.now)
            self._complete(mb)


class _Tap(Channel):
    """A rank's inbox that also wakes the lock-step process on any rank's put."""

    __slots__ = ("ring",)

    def __init__(self, env: simpy.Environment, ring: Callable[[], None]):
        super().__init__(env)
        self.ring = ring

    def put(self, item: object) -> None:
        self.items.append(item)
        self.ring()


class LockStep(_Ranks):
    """Every rank steps together: the next batch of each rank that has one, a dummy
    batch on the others."""

    def __init__(
        self,
        env: simpy.Environment,
        costs: CostModel,
        rec: Recorder,
        ranks: Sequence[EngineInstance],
        complete: Callable[[MicroBatch], object],
    ) -> None:
        super().__init__(costs, [_Tap(env, self.ring) for _ in range(costs.plan.dp)], complete)
        self.env, self.rec, self.ranks = env, rec, ranks
        for rank in ranks:
            rank.on_idle = self.ring  # a rank going idle may complete a step's set
        self.step_costs = DPStepCosts(costs, self.dp)
        self.dummy_steps = [0] * self.dp  # steps each rank ran a dummy batch in
        self.steps = 0  # lock-step steps run
        self._bell: simpy.Event | None = None
        env.process(self._lock_step())

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
        """A rank's own part runs from the step's start; the MoE layers start when the
        slowest rank's part ends. A dummy batch is recorded as idle (padding, no
        request's work)."""
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

    def summary(self) -> dict:
        """Lock-step steps run and the share of them each rank ran a dummy batch in."""
        return {
            "steps": self.steps,
            "dummy_step_share": [d / self.steps if self.steps else 0.0 for d in self.dummy_steps],
        }

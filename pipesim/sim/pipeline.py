"""The pipeline: stages, links and hops, booked as free-at clocks (physics.md §8).

A micro-batch visits the stages in order. Each stage (its TP group of GPUs, which
run in lock-step) is a first-come-first-served server: it takes micro-batches in
arrival order, waits for its rank's CPU to launch each (docs/engines.md §2),
computes, runs its TP collectives, and hands the micro-batch to the hop towards the
next stage without waiting for it (engines send asynchronously, isend). After the
last stage the sampled tokens travel back to the first stage, where the engine's
scheduler processes them (`MicroBatch.returned`).

Every directed PCIe link is a first-come-first-served server too: a TP collective or
a PP hop occupies every link it crosses for its duration (links.py).

Events. A visit's times follow from what is already known: its arrival, the stage's
free-at time, the rank's launch and the stage time. Only a transfer on a link that
another user (another stage's ring or hop) also crosses has to be booked at its own
simulated time, because who books first decides who waits; it gets one SimPy event.
A transfer whose links no other user crosses contends only with its own user's
earlier transfers, booked in the same order, so it is booked as soon as its start is
known, with no event. The outputs' return to the first stage is one event: the
micro-batch's `returned`, triggered at the return time with the request bookkeeping
as its first callback. Every row is appended when its work is booked, at or before
its start, which lets tally.py fold the rows as the run goes; work booked past the
run's stop counts only up to the stop.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..costs.primitives import ACT_BYTES
from ..costs.stage import CostModel
from ..measure.rows import Recorder
from .env import CountingEnvironment
from .links import Links

if TYPE_CHECKING:
    from ..engines.batches import MicroBatch

TOKEN_ID_BYTES = 4


class Pipeline:
    """The stages and links of one run, and the micro-batches moving through them."""

    def __init__(
        self,
        env: CountingEnvironment,
        costs: CostModel,
        rec: Recorder,
        links: Links,
        *,
        depth: int,
        empty_iteration_s: float | None,
        cpu_hop_s: float,
        complete: Callable[[MicroBatch], list],
    ):
        self.env, self.costs, self.rec, self.links = env, costs, rec, links
        self.pp = pp = costs.plan.pp
        self._complete = complete  # outputs back on the first stage -> finished requests
        # async depth (docs/engines.md §3): the last rank holds a batch's outputs until
        # its loop is `depth` iterations further (the send waits only for that batch's
        # own compute: the forward runs on its own stream)
        self.depth = depth if pp > 1 else 0
        self.iteration = -1  # the first rank's current slot iteration
        self._parked: deque[MicroBatch] = deque()  # computed on the last stage, outputs held
        # every PP rank runs the scheduler loop (docs/engines.md §2; `empty_iteration_s`
        # given: SGLang): ranks >= 1 keep a CPU free-at clock and the last slot iteration
        # they ran; each iteration costs what the first rank's did (`MicroBatch.host_s`),
        # an empty one `empty_iteration_s`, and the rank's thread then launches the stage
        self._empty_s, self._cpu_hop_s = empty_iteration_s or 0.0, cpu_hop_s
        self._rank_cpu = pp > 1 and empty_iteration_s is not None
        self._rank_free_s = [0.0] * pp
        self._rank_it = [-1] * pp
        self._users = self._link_users()
        for used in self._users.values():
            links.add(used)
        uses = Counter(d for links in self._users.values() for d in links)
        own = {u: all(uses[d] == 1 for d in links) for u, links in self._users.items()}
        # per stage, read on every visit: its ring's links, and whether only the ring (the
        # hop out of the stage) crosses its links, so that it is booked without an event
        self._ring = [self._users[("ar", s)] for s in range(pp)]
        self._ring_own = [own[("ar", s)] for s in range(pp)]
        self._hop_own = [own[("hop", s)] for s in range(pp)]
        self._queue: list[deque] = [deque() for _ in range(pp)]  # (arrival_s, micro-batch)
        self._free_s = [0.0] * pp  # when each stage finishes the visits booked so far
        self._held = [False] * pp  # a visit awaits a shared-link booking: the rest queue
        self._hop_bytes = 2 * costs.model.hidden * ACT_BYTES  # hidden states + residual, bf16
        self._launching = rec.host["kernel_launch"]

    # ---- links -----------------------------------------------------------------------
    def _link_users(self) -> dict:
        """The directed links each user crosses: a stage's TP ring, a PP hop."""
        plan, box, costs = self.costs.plan, self.costs.box, self.costs
        users: dict = {}
        for s in range(plan.pp):
            users[("ar", s)] = box.ring_links(plan.stage_gpus(s)) if plan.tp > 1 else ()
            users[("hop", s)] = costs.hop_links(s, (s + 1) % plan.pp) if plan.pp > 1 else ()
        return users

    # ---- stages ----------------------------------------------------------------------
    def launch(self, mb: MicroBatch) -> None:
        """The engine hands a formed micro-batch to the first stage, now."""
        self._arrive(0, mb, self.env.now)

    def _arrive(self, s: int, mb: MicroBatch, t: float) -> None:
        self._queue[s].append((t, mb))
        if not self._held[s]:
            self._advance(s)

    def _advance(self, s: int) -> None:
        """Book stage `s`'s queued visits, in order, as far as their times are known."""
        queue, stage_time, free_s, held = self._queue[s], self.costs.stage_time, self._free_s, self._held
        rank_cpu = self._rank_cpu and s > 0
        computed = self.rec.compute[s]
        while queue and not held[s]:
            t, mb = queue.popleft()
            start = t if t > free_s[s] else free_s[s]
            if rank_cpu:
                launch_s = self._rank_launch(s, mb)
                if launch_s > start:  # the GPU waits for this rank's CPU
                    start = launch_s
            compute_s, comm_s = stage_time(s, mb.shape)
            end = start + compute_s
            computed.append((start, end))
            if not s:  # the first stage's kernels being launched, from the stage's start
                launch_s = self.costs.host.launch_s(0, mb.shape.graphed, bool(mb.prefill))
                if launch_s:
                    self._launching.append((start, start + launch_s))
            if comm_s:
                if not self._ring_own[s]:  # booked at its own time: one event
                    held[s] = True
                    self._collective_at(end, s, mb, comm_s)
                    return
                c0, end = self.links.book(self._ring[s], end, comm_s)
                self.rec.comm[s].append((c0, end))
            free_s[s] = end
            self._leave(s, mb, end)

    def _collective_at(self, t: float, s: int, mb: MicroBatch, comm_s: float) -> None:
        self.env.call_at(t, lambda _ev: self._collective(s, mb, comm_s))

    def _collective(self, s: int, mb: MicroBatch, comm_s: float) -> None:
        """A TP collective on links other users share, booked at its start (now)."""
        c0, end = self.links.book(self._ring[s], self.env.now, comm_s)
        self.rec.comm[s].append((c0, end))
        self._free_s[s], self._held[s] = end, False
        self._leave(s, mb, end)
        self._advance(s)

    def _rank_launch(self, s: int, mb: MicroBatch) -> float:
        """When rank `s`'s CPU launches `mb` (docs/engines.md §2): after its own slot
        iterations up to this one, empty ones included, and after the previous rank's
        iteration for this slot plus the pickled metadata relay (`cpu_hop_ms`); its
        thread then launches the stage's kernels. A free-at clock: no event."""
        iterations = mb.it - self._rank_it[s] if self._rank_it[s] >= 0 else 1
        launch_s = (
            max(
                self._rank_free_s[s] + (iterations - 1) * self._empty_s,
                mb.cpu_launch_s + self._cpu_hop_s,
            )
            + mb.host_s
        )
        kernels_s = self.costs.host.launch_s(s, mb.shape.graphed, bool(mb.prefill))
        self._rank_free_s[s], self._rank_it[s] = launch_s + kernels_s, mb.it
        mb.cpu_launch_s = launch_s
        return launch_s

    # ---- hops and returns ------------------------------------------------------------
    def _leave(self, s: int, mb: MicroBatch, t: float) -> None:
        """`mb` is done on stage `s` at `t`: on to the next stage, or (from the last)
        its sampled tokens back to the first."""
        if self.pp == 1:
            self._return_at(mb, t)
        elif s == self.pp - 1 and self.depth:
            self.env.call_at(t, lambda _ev: self._park(mb))
        elif self._hop_own[s]:
            self._hop(s, mb, t)
        else:
            self.env.call_at(t, lambda _ev: self._hop(s, mb, self.env.now))

    def _hop(self, s: int, mb: MicroBatch, ready_s: float) -> None:
        if s == self.pp - 1:
            seconds = self.costs.hop_time(s, 0, mb.size * TOKEN_ID_BYTES)
        else:
            seconds = self.costs.hop_time(s, s + 1, mb.shape.tokens * self._hop_bytes)
        start, end = self.links.book(self._users[("hop", s)], ready_s, seconds)
        self.rec.hops[s].append((start, end))
        if s == self.pp - 1:
            self._return_at(mb, end)
        else:
            self._arrive(s + 1, mb, end)

    def _park(self, mb: MicroBatch) -> None:
        self._parked.append(mb)
        self._release()

    def next_iteration(self) -> None:
        """The first rank starts its next slot iteration (SGLang PP): held outputs whose
        release that iteration reaches go out."""
        self.iteration += 1
        if self._parked:
            self._release()

    def _release(self) -> None:
        """Send the held outputs the last rank's loop has reached (docs/engines.md §3):
        the batch of iteration j goes out at the last rank's iteration j + depth (taken
        as the first rank's: the ranks run the same loop)."""
        parked, depth = self._parked, self.depth
        while parked and parked[0].it + depth <= self.iteration:
            self._hop(self.pp - 1, parked.popleft(), self.env.now)

    def _return_at(self, mb: MicroBatch, t: float) -> None:
        """Trigger `mb.returned` at `t` (one event), the request bookkeeping first, so
        that the engine, waiting on it, resumes with the finished requests."""
        self.env.succeed_at(mb.returned, t, lambda: self._complete(mb))

    # ---- what the record says of the stages --------------------------------------------
    @property
    def stage_gpus(self) -> tuple[tuple[int, ...], ...]:
        """Each stage's TP group."""
        plan = self.costs.plan
        return tuple(tuple(plan.stage_gpus(s)) for s in range(plan.pp))

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(self.costs.plan.layers_per_stage)

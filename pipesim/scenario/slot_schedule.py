"""One engine instance's slot schedule at steady state: the batches it runs, how long
a round of them takes, where its requests sit, and the closed and open loops' figures
that follow (the steady-state model's engine rules, steady_model.py; docs/search.md §1).

The whole engine, or one DP rank: each rank alike. Every batch is priced by the cost
model as the simulation prices it (CostModel.stage_time and hop_time of its shape,
padded as the engine pads it; a DP lock step's step cost), and the engine's host loop
around it (the loop's CPU, the launches, the output path) as host_loop.py composes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..costs.dp import DPStepCosts
from ..costs.primitives import ACT_BYTES, Shape
from .host_loop import HostLoop

if TYPE_CHECKING:
    from ..costs.stage import CostModel
    from ..engines.protocol import EngineSettings
    from ..inputs.workload import Workload

TOKEN_ID_BYTES = 4  # a sampled token id on its way back to the first stage (sim/pipeline.py)


@dataclass(frozen=True)
class Pass:
    """One batch's trip: seconds it holds each station (a pipeline stage, or the DP
    ranks' lock step), from its launch to its outputs back on the first stage, and the
    host loop around it (host_loop.py): from one launch of its slot to the next (the
    trip and the loop's CPU as the release hides it), the loop's CPU before its launch,
    and each rank's loop busy for it."""

    station_s: tuple[float, ...]
    latency_s: float
    cycle_s: float
    before_s: float
    loop_s: tuple[float, ...]


@dataclass(frozen=True)
class State:
    """The steady state of one occupancy (requests per occupied slot, one rank)."""

    sizes: tuple[int, ...]
    round_s: float  # a decode round: every occupied slot launched once
    prefill_round_s: float  # a round with one cohort's prompt in it
    ttft_s: float
    tpot_s: float
    request_rate: float  # requests per second of the rank
    output_tok_s: float  # output tokens per second of the rank


@dataclass(frozen=True)
class RankEstimate:
    states: tuple[State, ...]  # the point's occupancy first, then the bracket's other end
    domain: str
    notes: tuple[str, ...]
    overloaded: bool = False


class RankSchedule:
    """One engine instance (the whole engine, or one DP rank) at steady state."""

    def __init__(
        self,
        costs: CostModel,
        settings: EngineSettings,
        host: HostLoop,
        workload: Workload,
        bound: bool = False,
    ):
        self.costs, self.s, self.host = costs, settings, host
        self.bound = bound  # a bound only: a round is its busiest station's, no trip
        plan = costs.plan
        self.pp = plan.pp
        self.in_len = workload.input_len.mean
        self.out_len = max(workload.output_len.mean, 1.0)
        # a decoding request's context over its life: prompt + half its outputs
        self.ctx = int(self.in_len + self.out_len / 2)
        budget = max(settings.prefill_budget, 1)
        self.chunks = max(1, math.ceil(self.in_len / budget))  # passes one prompt takes
        # prompts one batch takes whole: the budget's, and no more than a slot holds
        self.per_cohort = max(1, min(int(budget // max(self.in_len, 1)), settings.slot_cap or budget))
        self.lock = DPStepCosts(costs, plan.dp) if plan.moe_spans_dp else None
        self.dp = plan.dp
        self._passes: dict = {}

    # ---- batches --------------------------------------------------------------------
    def _shape(self, decode: int, prefill: tuple) -> Shape:
        """The batch's shape as the simulation forms it (engines/batches.py MicroBatch):
        a graphed batch padded to the captured size, its mean context over every row."""
        s = self.s
        tokens = sum(c for c, _ in prefill)
        graphed = s.graphed(decode, tokens)
        pad = max(s.graph_tokens(decode, tokens) - decode - tokens, 0) if graphed else 0
        rows = decode + pad
        ctx = decode * self.ctx // rows if decode else 0
        return Shape(rows, ctx, prefill, graphed)

    def batch(self, decode: int, prefill: tuple = ()) -> Pass:
        """A batch of `decode` requests and `prefill` chunks ((tokens, prefix) each)."""
        key = (decode, prefill)
        hit = self._passes.get(key)
        if hit is None:
            hit = self._passes[key] = self._pass(self._shape(decode, prefill), decode + len(prefill))
        return hit

    def _pass(self, shape: Shape, size: int) -> Pass:
        costs, host = self.costs, self.host
        tokens = sum(c for c, _ in shape.prefill)
        before = host.before_s(size, tokens)
        if self.lock is not None:  # every DP rank steps together, alike (they finish alike)
            _, sync_s, moe_c, moe_a = self.lock.step([shape] * self.dp)
            stations: tuple[float, ...] = (sync_s + moe_c + moe_a,)
            latency = stations[0]
        else:
            pp = self.pp
            stations = tuple(sum(costs.stage_time(s, shape)) for s in range(pp))
            hop_bytes = shape.tokens * 2 * costs.model.hidden * ACT_BYTES  # hidden states + residual
            # a stage starts once the batch is there and, where every rank runs the loop
            # (SGLang PP), once its rank has had the metadata and run the iteration
            latency = launched = 0.0
            for s in range(pp):
                if s and host.ranks_run_loop:
                    launched += host.relay_s + before
                    latency = max(latency, launched)
                latency += stations[s]
                if s < pp - 1:
                    latency += costs.hop_time(s, s + 1, hop_bytes)
            if pp > 1:
                latency += costs.hop_time(pp - 1, 0, size * TOKEN_ID_BYTES)
        around = host.batch(latency, size, tokens, shape.graphed)
        return Pass(stations, latency, around.step.step_s, around.before_s, around.rank_loop_s)

    # ---- a round --------------------------------------------------------------------
    def period(self, passes: list[Pass]) -> float:
        """The max-plus period of one round of `passes` (one per occupied slot, in slot
        order): a slot launches again only after its outputs are back and the loop has
        run its CPU, as the release hides it (`Pass.cycle_s`: with the overlap scheduler
        or async scheduling the loop runs beside the GPU), each station serves every
        batch of the round, and each rank's loop runs every iteration of it (SGLang:
        every slot's turn, empty ones too; vLLM: every formed batch)."""
        k = len(passes)
        cycle = max(p.cycle_s for p in passes)
        station = max(sum(col) for col in zip(*(p.station_s for p in passes), strict=True))
        empties = 0 if self.s.inflight_groups else max(self.s.slots - k, 0)
        loop = max(sum(col) for col in zip(*(p.loop_s for p in passes), strict=True))
        loop += empties * self.host.empty_s
        return max(0.0 if self.bound else cycle, station, loop)

    # ---- occupancy ------------------------------------------------------------------
    def cohorts(self, admitted: int, split_first: bool) -> list[int]:
        """The prefill batches the admitted requests enter in: whole prompts up to the
        budget each. Where prompts ride with decodes (vLLM) the decodes of the prompts'
        group take their tokens of the budget first (running requests are scheduled
        before waiting ones).

        `split_first`: the requests reach an idle rank one at a time (the serial front
        end hands one over every `frontend_s`): the first alone, as the rank wakes at
        it, and each later batch the requests that arrived until the loop forms its
        next batch (after its own CPU and launches while a slot or batch is free and a
        request already waits, else after the last batch's return); with fixed lengths
        those cohorts stay apart in every later lifetime, and a queue keeps them
        (docs/search.md §1)."""
        per = self.per_cohort
        if self.s.mixes_prefill:
            group = admitted / (self.s.inflight_groups if self.pp > 1 else 1)
            while per > 1 and per * self.in_len + group - per > self.s.prefill_budget:
                per -= 1
        out: list[int] = []
        left = admitted
        if split_first and admitted > 1:
            width = self.s.inflight_groups or self.s.slots
            gap_of = {}
            out = [1]
            left -= 1
            while left > 0:
                last = out[-1]
                key = (last, len(out) < width)
                if key not in gap_of:
                    p = self.batch(0, ((int(min(self.in_len, self.s.prefill_budget)), 0),) * last)
                    # a free slot or batch is formed at once if a request waits by the
                    # time the loop is done with this one; else the loop blocks on a return
                    free = len(out) < width and p.loop_s[0] >= self.host.frontend_s
                    gap_of[key] = p.loop_s[0] if free else p.cycle_s
                n = max(1, int(gap_of[key] / self.host.frontend_s))
                out.append(min(per, left, n))
                left -= out[-1]
            return out
        while left > 0:
            out.append(min(per, left))
            left -= out[-1]
        return out

    def formation(self, cohorts: list[int]) -> list[tuple[int, int]]:
        """(cohort, slot) as the engine places them: SGLang prefills each into the
        slot whose turn it is, every slot up to its cap (the first arrival's slot takes
        the next cohort too: its turn comes first once that prompt is back); vLLM's
        groups take the cohorts as they form, up to its batches in flight."""
        s = self.s
        if s.inflight_groups:
            if s.batches_per_request > 1 and self.pp == 1:
                return [(c, 0) for c in cohorts]  # every request rides every batch: one group
            groups = max(1, min(s.inflight_groups, len(cohorts) - (cohorts[0] == 1 and len(cohorts) > 1)))
            return [(c, min(i, groups - 1) if i < groups else i % groups) for i, c in enumerate(cohorts)]
        slots, cap = s.slots, s.slot_cap or sum(cohorts)
        sizes = [0] * slots
        placed, i = [], 0
        for n, c in enumerate(cohorts):
            if n == 1 and cohorts[0] == 1:
                i = 0  # the first arrival's slot takes the next cohort
            for _ in range(slots):
                if sizes[i] + c <= cap:
                    break
                i = (i + 1) % slots
            sizes[i] += c
            placed.append((c, i))
            i = (i + 1) % slots
        return placed

    def clumped(self, cohorts: list[int]) -> list[tuple[int, int]]:
        """(cohort, slot) with slots filled to their cap one after another: a finished
        cohort's replacements join the slot whose return the scheduler awaits (vLLM:
        the group of the next batch formed, as many as its token budget takes)."""
        s = self.s
        if s.inflight_groups:
            cap = sum(cohorts) if s.batches_per_request > 1 and self.pp == 1 else max(1, s.prefill_budget)
        else:
            cap = s.slot_cap or sum(cohorts)
        placed, slot, used = [], 0, 0
        for c in cohorts:
            if used + c > cap and used:
                slot, used = slot + 1, 0
            placed.append((c, slot))
            used += c
        return placed

    # ---- the closed loop ------------------------------------------------------------
    def closed(self, admitted_all: int, clients_all: int, fixed: bool) -> RankEstimate:
        """A closed loop of `clients_all` clients, `admitted_all` of them running (every
        DP rank). The point is the engine's formation. With several slots or groups in
        a pipeline, which slot a request joins follows when it reaches the scheduler
        (the serial front end hands requests over one at a time, cohorts finish and
        their replacements return at their own times), so the bracket reaches the other
        fillings the engine's rules allow: the fewest slots (each filled to its cap;
        vLLM: one group) and an even spread over the pipeline's slots and over all of
        them (docs/search.md §1)."""
        admitted = max(1, round(admitted_all / self.dp))
        clients = max(admitted, round(clients_all / self.dp))
        queued = clients > admitted
        split = fixed and self.host.frontend_s > 0
        cohorts = self.cohorts(admitted, split)
        point = self.formation(cohorts)
        states = [self._steady(point, queued, clients, fixed)]
        notes: list[str] = []
        domain = "in"
        seen = {states[0].sizes}
        for other in self._fillings(cohorts, admitted):
            st = self._steady(other, queued, clients, fixed)
            if st.sizes not in seen:
                seen.add(st.sizes)
                states.append(st)
        if len(states) > 1:
            domain = "bracketed"
            notes.append(
                f"slots {'/'.join(map(str, states[0].sizes))} may fill as "
                + " or ".join("/".join(map(str, st.sizes)) for st in states[1:])
                + " (bracketed)"
            )
        return RankEstimate(tuple(states), domain, tuple(notes))

    def _steady(self, point: list[tuple[int, int]], queued: bool, clients: int, fixed: bool) -> State:
        """The steady state of cohorts `point`: with fixed lengths their prompts run as
        a train; else requests finish apart and their replacements enter a few at a turn."""
        if fixed:
            return self.state(point, queued, clients, train=True)
        sizes, st = slot_sizes(point), None
        arrivals = 1.0
        for _ in range(4):
            placed: list[tuple[float, int]] = []
            for j, b in enumerate(sizes):
                events = max(1, round(b / arrivals))
                placed += [(b / events, j)] * events
            st = self.state(placed, queued, clients)
            arrivals = max(1.0, st.request_rate * st.round_s / len(sizes))
        assert st is not None  # the loop ran
        return st

    def _fillings(self, cohorts: list[int], admitted: int) -> list[list[tuple[int, int]]]:
        """The other slot fillings a pipeline's engine may settle in (`closed`): none
        with one slot or group, one request, or async scheduling's single group."""
        s = self.s
        width = s.inflight_groups or s.slots
        if self.pp == 1 or width == 1 or admitted == 1 or (s.inflight_groups and s.batches_per_request > 1):
            return []
        cap = s.slot_cap or admitted
        fewest = self.clumped(cohorts) if not s.inflight_groups else [(c, 0) for c in cohorts]
        spreads = []
        for n in sorted({min(self.pp, width), width}):
            share = [admitted // n + (j < admitted % n) for j in range(n)]
            if max(share) <= cap:
                spreads.append([(c, j) for j, b in enumerate(share) for c in self._split(b)])
        return [fewest, *spreads]

    def _split(self, requests: int) -> list[int]:
        """A slot's `requests` as the prefill batches they enter in (the budget's share)."""
        out = []
        while requests > 0:
            out.append(min(self.per_cohort, requests))
            requests -= out[-1]
        return out

    def state(
        self, placed: Sequence[tuple[float, int]], queued: bool, clients: int, train: bool = False
    ) -> State:
        """The steady state with the cohorts `placed` ((prompts, slot) each, entering
        once per request lifetime) (module docstring). `train`: fixed lengths, so the
        cohorts finish one after another and their replacements' prompts run in
        consecutive rounds (a train, each slot's in its turn); else each prompt's
        round stands apart."""
        s, host, out_len = self.s, self.host, self.out_len
        order = sorted({j for _, j in placed})
        sizes = slot_sizes(placed)
        A = sum(n for n, _ in placed)
        k = len(sizes)
        decodes = [self.batch(b) for b in sizes]
        round_s = self.period(decodes)
        chunk = int(min(self.in_len, float(s.prefill_budget)))
        prompts = [
            self.batch(
                max(sizes[order.index(j)] - round(n), 0) if s.mixes_prefill else 0,
                ((chunk, 0),) * (max(1, round(n)) if self.chunks == 1 else 1),
            )
            for n, j in placed
        ]
        lat = [p.latency_s for p in prompts]
        # from the prompt's turn to its first token back: the loop's CPU before the
        # launch (beside the GPU with the overlap scheduler or async scheduling) and the trip
        reach = [p.latency_s + (0.0 if host.overlap else p.before_s) for p in prompts]
        tokenize = (
            sum(n * host.frontend_s * (n + 1.0) / 2.0 for n, _ in placed) / A
        )  # its place in its cohort
        # a replacement waits for the next slot's turn; none when the queue holds it, or
        # when every request finished at once (one SGLang slot: the rank idles and
        # wakes at the arrival); with the loop beside the GPU the batch formed before
        # the prompt's is already launched, and the prompt follows it
        idle = train and ((k == 1 and not s.mixes_prefill) or len(placed) == 1)
        turn_s = 0.0 if queued or idle else round_s / (2.0 * k)
        ahead_s = round_s if host.overlap and not idle else 0.0
        out_s = host.delay_s(A / k)  # a client sees a step's tokens after the output path
        if train:
            engine_s, in_train, wait = self._train(placed, order, prompts, decodes)
            rounds = max(
                out_len - 1.0 - sum(n * d for (n, _), d in zip(placed, in_train, strict=True)) / A, 0.0
            )
            busy = engine_s + rounds * round_s  # a train and the decode rounds until the next
        else:
            # each prompt's round apart: it stretches the round it is in, and (SGLang)
            # its slot's other requests skip a decode
            extra, lost = [], 0.0
            for (n, j), p in zip(placed, prompts, strict=True):
                i = order.index(j)
                extra.append(max(self.period(decodes[:i] + [p] + decodes[i + 1 :]) - round_s, 0.0))
                if not s.mixes_prefill:
                    lost += (sizes[i] - n) / A
            busy = ((out_len - 1.0 + lost * self.chunks) * round_s + sum(extra) * self.chunks) + sum(
                n * p.cycle_s for (n, _), p in zip(placed, prompts, strict=True)
            ) / A
            wait = [0.0] * len(placed)
        # a prompt of several chunks: its later chunks follow through the pipeline
        first = self.batch(0, ((chunk, 0),))
        chunk_s = (self.chunks - 1) * (max(first.station_s) if self.pp > 1 else first.cycle_s)
        engine_ttft = sum(n * (w + x) for (n, _), w, x in zip(placed, wait, reach, strict=True)) / A + chunk_s
        if queued:  # a finished request's slot takes a waiting one at its next turn
            rate = A / busy
            ttft = (
                max(clients / rate - out_s - (busy - engine_ttft), engine_ttft + tokenize + ahead_s) + out_s
            )
        else:
            ttft = tokenize + turn_s + ahead_s + engine_ttft + out_s
            rate = A / (busy + out_s + tokenize + turn_s + ahead_s)
        tpot = (busy - engine_ttft) / max(out_len - 1.0, 1.0)
        # the output path and the API process are serial, one of each for every DP rank
        # (sim/frontend.py): past saturation they set the pace, a client sees its tokens
        # as they pass them
        load = host.busy(self.dp * rate * out_len * k / A, A / k, self.dp * rate)  # steps of A / k tokens
        if load > 1.0:
            tpot *= load
            rate /= load
        return State(tuple(sizes), round_s, max(lat), ttft, tpot, rate, rate * out_len)

    def _train(
        self, placed: Sequence[tuple[float, int]], order: list[int], prompts: list[Pass], decodes: list[Pass]
    ) -> tuple[float, list[int], list[float]]:
        """A lifetime's prompts as consecutive rounds: round r carries every slot's r-th
        cohort's prompt (SGLang: instead of the slot's decode; vLLM: with it) and the
        other slots' decodes. Returns the train's seconds, the decode steps each cohort's
        requests take during it, and each cohort's wait in it.

        SGLang: a slot's cohorts decode in the same rounds (none during a prompt's),
        finish together and wait for the slot's earlier prompts. vLLM: cohorts keep
        decoding beside a prompt and finish a round apart, so the train rolls: each
        cohort's replacement arrives while the round carrying the cohort before it
        runs, waits for that round, and every cohort decodes in every round of the
        train but its own prompt's."""
        mixed = self.s.mixes_prefill
        per_slot: dict[int, list[int]] = {j: [] for j in order}
        for c, (_, j) in enumerate(placed):
            per_slot[j].append(c)
        rounds = max(len(v) for v in per_slot.values())
        t, last, waits = 0.0, 0.0, [0.0] * len(placed)
        for r in range(rounds):
            passes = []
            for i, j in enumerate(order):
                mine = per_slot[j]
                if r < len(mine):
                    waits[mine[r]] = last if mixed else t
                    passes.append(prompts[mine[r]])
                else:
                    passes.append(decodes[i])
            last = self.period(passes) * self.chunks
            t += last
        in_train = [rounds * self.chunks - 1 if mixed else rounds - len(per_slot[j]) for _, j in placed]
        return t, in_train, waits


def slot_sizes(placed: Sequence[tuple[float, int]]) -> list[int]:
    """Requests per occupied slot, in slot order, of cohorts placed (prompts, slot)."""
    slots: dict[int, float] = {}
    for n, j in placed:
        slots[j] = slots.get(j, 0) + n
    return [max(1, round(slots[j])) for j in sorted(slots)]

"""One engine instance's slot schedule at steady state: the batches it runs, how long
a round of them takes, where its requests sit, and the closed and open loops' figures
that follow (the steady-state model's engine rules, steady_model.py; docs/search.md §1).

The whole engine, or one DP rank: each rank alike. Every batch is priced by the cost
model as the simulation prices it (CostModel.stage_time and hop_time of its shape,
padded as the engine pads it; a DP lock step's step cost), and the scheduler's CPU is
the host loop's (host_loop.py).
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
# An open loop is in the model's domain only below this share of its capacity: nearer
# saturation the queue and the tail latencies depend on the arrivals' bursts, which a
# steady state has no term for (a stated boundary, not fitted).
OPEN_LOOP_MAX_LOAD = 0.85


@dataclass(frozen=True)
class Pass:
    """One batch's trip: seconds it holds each station (a pipeline stage, or the DP
    ranks' lock step), and from its launch to its outputs back on the first stage."""

    station_s: tuple[float, ...]
    latency_s: float


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
        costs = self.costs
        if self.lock is not None:  # every DP rank steps together, alike (they finish alike)
            _, sync_s, moe_c, moe_a = self.lock.step([shape] * self.dp)
            step = sync_s + moe_c + moe_a
            return Pass((step,), step)
        pp = self.pp
        stations = tuple(sum(costs.stage_time(s, shape)) for s in range(pp))
        hop_bytes = shape.tokens * 2 * costs.model.hidden * ACT_BYTES  # hidden states + residual
        hops = sum(costs.hop_time(s, s + 1, hop_bytes) for s in range(pp - 1))
        back = costs.hop_time(pp - 1, 0, size * TOKEN_ID_BYTES) if pp > 1 else 0.0
        return Pass(stations, sum(stations) + hops + back)

    # ---- a round --------------------------------------------------------------------
    def period(self, passes: list[Pass]) -> float:
        """The max-plus period of one round of `passes` (one per occupied slot, in slot
        order): a slot launches again only after its outputs are back and the
        scheduler's CPU has run (vLLM async: `batches_per_request` batches of a request
        may be in flight, so the trip is shared), each station serves every batch of
        the round, and the scheduler's CPU runs every iteration of it (SGLang: every
        slot's turn, empty ones too; vLLM: every formed batch)."""
        cpu = self.host.iteration_s
        k = len(passes)
        trip = (max(p.latency_s for p in passes) + cpu) / self.s.batches_per_request
        station = max(sum(col) for col in zip(*(p.station_s for p in passes), strict=True))
        iterations = k if self.s.inflight_groups else max(self.s.slots, k)
        return max(0.0 if self.bound else trip, station, iterations * cpu)

    # ---- occupancy ------------------------------------------------------------------
    def cohorts(self, admitted: int, split_first: bool) -> list[int]:
        """The prefill batches the admitted requests enter in: whole prompts up to the
        budget each. `split_first`: the first arrival alone, as an idle rank wakes at
        it while the serial tokenizer hands the others over one by one (docs/search.md
        §1); with fixed lengths that cohort stays apart in every later lifetime."""
        out = [1] if split_first and admitted > 1 else []
        left = admitted - sum(out)
        while left > 0:
            out.append(min(self.per_cohort, left))
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
        DP rank). The point is the engine's formation; where fixed-length cohorts may
        merge into fewer slots (SGLang, no queue) the bracket reaches the merged
        occupancy (docs/search.md §1)."""
        admitted = max(1, round(admitted_all / self.dp))
        clients = max(admitted, round(clients_all / self.dp))
        queued = clients > admitted
        split = fixed and not queued and self.host.frontend_s > 0
        cohorts = self.cohorts(admitted, split)
        point = self.formation(cohorts)
        if fixed:
            states = [self.state(point, queued, clients, train=True)]
        else:  # requests finish apart: their replacements enter a few at a turn
            sizes, st = _slot_sizes(point), None
            arrivals = 1.0
            for _ in range(4):
                placed = []
                for j, b in enumerate(sizes):
                    events = max(1, round(b / arrivals))
                    placed += [(b / events, j)] * events
                st = self.state(placed, queued, clients)
                arrivals = max(1.0, st.request_rate * st.round_s / len(sizes))
            assert st is not None  # the loop ran
            states = [st]
        notes: list[str] = []
        domain = "in"
        if fixed and not queued and not self.s.mixes_prefill:
            merged = self.clumped(cohorts)
            if len({j for _, j in merged}) < len({j for _, j in point}):
                states.append(self.state(merged, queued, clients, train=fixed))
                domain = "bracketed"
                notes.append(
                    f"fixed lengths: slots {'/'.join(map(str, states[0].sizes))} may merge into "
                    f"{'/'.join(map(str, states[1].sizes))} (bracketed)"
                )
        return RankEstimate(tuple(states), domain, tuple(notes))

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
        sizes = _slot_sizes(placed)
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
        tokenize = (
            sum(n * host.frontend_s * (n + 1.0) / 2.0 for n, _ in placed) / A
        )  # its place in its cohort
        # a replacement waits for the next slot's turn; none when the queue holds it, or
        # when every request finished at once (one SGLang slot: the rank idles and
        # wakes at the arrival)
        idle = train and k == 1 and not s.mixes_prefill
        turn_s = 0.0 if queued or idle else round_s / (2.0 * k)
        detok_s = host.detokenize_s(A / k)
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
                n * x for (n, _), x in zip(placed, lat, strict=True)
            ) / A
            wait = [0.0] * len(placed)
        # a prompt of several chunks: its later chunks follow through the pipeline
        first = self.batch(0, ((chunk, 0),))
        chunk_s = (self.chunks - 1) * (max(first.station_s) if self.pp > 1 else first.latency_s)
        engine_ttft = sum(n * (w + x) for (n, _), w, x in zip(placed, wait, lat, strict=True)) / A + chunk_s
        if queued:  # a finished request's slot takes a waiting one at its next turn
            rate = A / busy
            ttft = max(clients / rate - detok_s - (busy - engine_ttft), engine_ttft + tokenize)
        else:
            ttft = tokenize + turn_s + engine_ttft
            rate = A / (busy + detok_s + tokenize + turn_s)
        if host.frontend_s:
            rate = min(rate, 1.0 / host.frontend_s)  # the tokenizer serves one at a time
        tpot = (busy - engine_ttft) / max(out_len - 1.0, 1.0)
        return State(tuple(sizes), round_s, max(lat), ttft, tpot, rate, rate * out_len)

    def _train(
        self, placed: Sequence[tuple[float, int]], order: list[int], prompts: list[Pass], decodes: list[Pass]
    ) -> tuple[float, list[int], list[float]]:
        """A lifetime's prompts as consecutive rounds: round r carries every slot's r-th
        cohort's prompt (SGLang: instead of the slot's decode; vLLM: with it) and the
        other slots' decodes. Returns the train's seconds, the decode steps each cohort's requests take
        during it, and each cohort's wait in it."""
        per_slot: dict[int, list[int]] = {j: [] for j in order}
        for c, (_, j) in enumerate(placed):
            per_slot[j].append(c)
        rounds = max(len(v) for v in per_slot.values())
        t, waits = 0.0, [0.0] * len(placed)
        for r in range(rounds):
            passes = []
            for i, j in enumerate(order):
                mine = per_slot[j]
                if r < len(mine):
                    # SGLang: a slot's cohorts decode in the same rounds (none during a
                    # prompt's), finish together and wait for the slot's earlier prompts;
                    # vLLM's keep decoding beside a prompt and finish a round apart
                    waits[mine[r]] = 0.0 if self.s.mixes_prefill else t
                    passes.append(prompts[mine[r]])
                else:
                    passes.append(decodes[i])
            t += self.period(passes) * self.chunks
        in_train = []
        for c, (_, j) in enumerate(placed):
            pos = per_slot[j].index(c)
            mixed = self.s.mixes_prefill
            in_train.append(rounds - 1 - pos if mixed else rounds - len(per_slot[j]))
        return t, in_train, waits

    # ---- the open loop --------------------------------------------------------------
    def open(self, rate: float, cap: int, requests: int, last_arrival_s: float) -> RankEstimate:
        """Arrivals at `rate` (req/s, this rank) join the slot whose turn follows them
        (clumped), a prompt batch of those that arrived in a round. Below saturation
        nobody queues: the requests in the engine are Poisson-distributed with mean rate
        x stay (M/G/inf), so a request's round is averaged over them; the stay is found
        by iteration. The run's throughput is its `requests` over the last arrival plus
        a stay (the simulation measures an open loop from its start to its last
        finish)."""
        out_len = self.out_len
        full = self.state(self.clumped(self.cohorts(cap, False)), True, cap)
        capacity = full.request_rate
        if rate >= capacity:
            why = f"overloaded: {rate:.3g} req/s arrive, about {capacity:.3g} served"
            return RankEstimate((full,), "outside", (why,), overloaded=True)
        chunk = int(min(self.in_len, float(self.s.prefill_budget)))
        held = rate * self.batch(1).latency_s * out_len
        for _ in range(40):
            round_s, extra_s, lat_s, sizes = self._poisson_round(held, cap, rate, chunk)
            arrivals = max(1.0, rate * round_s)
            # each prompt batch stalls (SGLang) or stretches (vLLM) the round it is in
            # the prompt batches of a stay: rate x stay arrivals, `arrivals` a batch
            tpot = round_s + held / arrivals * extra_s / max(out_len - 1.0, 1.0)
            ttft = self.host.frontend_s + round_s / 2.0 + lat_s + (self.chunks - 1) * lat_s
            new = rate * (ttft + tpot * (out_len - 1.0))
            done = abs(new - held) < 0.01 * held + 0.05
            held = 0.5 * (held + new)
            if done:
                break
        stay = ttft + tpot * (out_len - 1.0)
        served = requests / (last_arrival_s + stay) if requests else rate
        st = State(sizes, round_s, lat_s, ttft, tpot, served, served * out_len)
        if rate > OPEN_LOOP_MAX_LOAD * capacity:
            why = f"open loop at {rate / capacity:.0%} of its capacity: queueing near saturation is not modelled"
            return RankEstimate((st,), "outside", (why,))
        return RankEstimate((st,), "in", ())

    def _poisson_round(
        self, mean: float, cap: int, rate: float, chunk: int
    ) -> tuple[float, float, float, tuple[int, ...]]:
        """A tagged request's round with the others Poisson(mean - 1), capped: its mean
        period, the mean extra time of a round with one prompt batch in it, that
        batch's trip, and the occupancy at the mean."""
        others = max(mean - 1.0, 0.0)
        top = min(cap - 1, int(others + 6.0 * math.sqrt(others) + 6))
        pmf = math.exp(-others)
        round_s = extra_s = lat_s = weight = 0.0
        for m in range(top + 1):
            if m:
                pmf *= others / m
            sizes = _slot_sizes(self.clumped(self.cohorts(m + 1, False)))
            decodes = [self.batch(b) for b in sizes]
            base = self.period(decodes)
            n_p = max(1, min(m + 1, round(rate * base)))
            prompt = self.batch(sizes[0] if self.s.mixes_prefill else 0, ((chunk, 0),) * n_p)
            round_s += pmf * base
            # SGLang: the prompt takes the slot's turn (its decode waits the whole round);
            # vLLM: it rides with the decodes and lengthens their round
            extra_s += pmf * max(
                self.period([prompt] + decodes[1:]) - (base if self.s.mixes_prefill else 0.0), 0.0
            )
            lat_s += pmf * prompt.latency_s
            weight += pmf
        at = _slot_sizes(self.clumped(self.cohorts(max(1, round(mean)), False)))
        return round_s / weight, extra_s / weight, lat_s / weight, tuple(at)


def _slot_sizes(placed: Sequence[tuple[float, int]]) -> list[int]:
    """Requests per occupied slot, in slot order, of cohorts placed (prompts, slot)."""
    slots: dict[int, float] = {}
    for n, j in placed:
        slots[j] = slots.get(j, 0) + n
    return [max(1, round(slots[j])) for j in sorted(slots)]

"""An open loop's steady state (the steady-state model, docs/search.md §1): Poisson
arrivals at a rate below the engine's capacity, each joining the slot whose turn follows
it, priced on one engine instance's slot schedule (slot_schedule.py).
"""

from __future__ import annotations

import math

from .slot_schedule import RankEstimate, RankSchedule, State, slot_sizes

# An open loop is in the model's domain only below this share of its capacity: nearer
# saturation the queue and the tail latencies depend on the arrivals' bursts, which a
# steady state has no term for (a stated boundary, not fitted).
OPEN_LOOP_MAX_LOAD = 0.85


def open_loop(
    rank: RankSchedule, rate: float, cap: int, requests: int, last_arrival_s: float
) -> RankEstimate:
    """Arrivals at `rate` (req/s, this rank) join the slot whose turn follows them
    (clumped), a prompt batch of those that arrived in a round. Below saturation
    nobody queues: the requests in the engine are Poisson-distributed with mean rate
    x stay (M/G/inf), so a request's round is averaged over them; the stay is found
    by iteration. The run's throughput is its `requests` over the last arrival plus
    a stay (the simulation measures an open loop from its start to its last
    finish)."""
    out_len = rank.out_len
    full = rank.state(rank.clumped(rank.cohorts(cap, False)), True, cap)
    capacity = full.request_rate
    if rate >= capacity:
        why = f"overloaded: {rate:.3g} req/s arrive, about {capacity:.3g} served"
        return RankEstimate((full,), "outside", (why,), overloaded=True)
    chunk = int(min(rank.in_len, float(rank.s.prefill_budget)))
    held = rate * rank.batch(1).latency_s * out_len
    for _ in range(40):
        round_s, extra_s, lat_s, sizes = _poisson_round(rank, held, cap, rate, chunk)
        arrivals = max(1.0, rate * round_s)
        # each prompt batch stalls (SGLang) or stretches (vLLM) the round it is in
        # the prompt batches of a stay: rate x stay arrivals, `arrivals` a batch
        tpot = round_s + held / arrivals * extra_s / max(out_len - 1.0, 1.0)
        ttft = rank.host.frontend_s + round_s / 2.0 + lat_s + (rank.chunks - 1) * lat_s
        ttft += rank.host.delay_s(held / max(len(sizes), 1))
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
    rank: RankSchedule, mean: float, cap: int, rate: float, chunk: int
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
        sizes = slot_sizes(rank.clumped(rank.cohorts(m + 1, False)))
        decodes = [rank.batch(b) for b in sizes]
        base = rank.period(decodes)
        n_p = max(1, min(m + 1, round(rate * base)))
        prompt = rank.batch(sizes[0] if rank.s.mixes_prefill else 0, ((chunk, 0),) * n_p)
        round_s += pmf * base
        # SGLang: the prompt takes the slot's turn (its decode waits the whole round);
        # vLLM: it rides with the decodes and lengthens their round
        extra_s += pmf * max(
            rank.period([prompt] + decodes[1:]) - (base if rank.s.mixes_prefill else 0.0), 0.0
        )
        lat_s += pmf * prompt.latency_s
        weight += pmf
    at = slot_sizes(rank.clumped(rank.cohorts(max(1, round(mean)), False)))
    return round_s / weight, extra_s / weight, lat_s / weight, tuple(at)

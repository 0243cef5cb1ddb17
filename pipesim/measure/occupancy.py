"""The micro-batch slots by position: at every moment, the batches in flight (launched,
their sampled tokens not yet back on the first stage) sorted fullest first; over the
measurement window, the mean requests of the k-th fullest and the share of time there
was no k-th (that position empty).

Why positions, not slot labels. A run that repeats often moves its busy slots on by one
label each period (steady.period's `shift`): a mean per slot label then averages the
busy and the idle slots into equal figures (SGLang TP2 x PP4 at C = 64 reads 32 32 32 32
per label where two slots carry batches of 63 and 1 requests and two carry none). The
k-th fullest batch has no label to rotate: its figures are the same whichever slots
hold the work.

Why in flight. A stage computes only a batch that is in flight: with m batches in
flight at most m stages can work, so the empty positions are the pipeline's bubble
seen from the scheduler's side. SGLang: a slot's batch is in flight from its launch
until its outputs are back on the first rank (with async depth, the iterations the
last rank holds them included: docs/engines.md §2-3); between the return and the
slot's next launch the first rank's CPU processes them, and nothing of that slot is
in the pipeline. The positions are the slots (pp + async depth). vLLM: a decoding
request stays with the batch it was scheduled with, so the batches in flight are its
groups and the positions are `max_concurrent_batches` (docs/engines.md §6);
`Result.group_sizes` samples the same batches at each launch (a mean per launch),
these figures weight them by time. One position (TP, no PP): the batch in flight,
decode or a prefill of newly arrived requests, and the CPU's turn as an empty stretch.

Exact from the rows. Each launched batch (its launch time and requests) and each
token return are rows; one pipeline returns its batches in launch order (the stages
and hops serve first come first served: sim/pipeline.py), so the i-th return is the
i-th batch's. Between two of these events the batches in flight do not change, so the
figures are sums of (state x time) over the stretches between events, clipped to the
window. They fold as the run goes (tally.py): the batches in flight and the time the
sums have reached are carried across a cut, so the figures are the same wherever the
cuts fall. Memory: the batches in flight, at most one per position.

Not with DP ranks: their returns interleave, and a return row does not say whose it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import chain

import numpy as np

ORDINALS = ("1st", "2nd", "3rd")


def ordinal(k: int) -> str:
    """'1st', '2nd', '3rd', '4th', ... for position k counted from 1."""
    return ORDINALS[k - 1] if k <= len(ORDINALS) else f"{k}th"


class Occupancy:
    """Running sums over the window of the batches in flight, by position (the module
    docstring). `fold` takes the rows of one stretch of time; `means` and
    `empty_shares` read the window's figures."""

    def __init__(self, positions: int) -> None:
        self.positions = positions
        self._inflight: list[int] = []  # requests of the batches in flight, launch order
        self._t = 0.0  # the time the sums have reached (rows start at time 0)
        self.requests_s = np.zeros(positions)  # integral of the k-th fullest batch's requests
        # seconds of the window with exactly m batches in flight (m = 0 .. positions)
        self.count_s = np.zeros(positions + 1)

    def fold(self, launches: Sequence, returns: Sequence, upto_s: float, t0: float | None) -> None:
        """Take the launches (rows: time first, then `requests`) and returns (rows: time
        first) of one stretch, each list in time order, all before `upto_s` (or at it,
        at the run's stop), and carry the sums to `upto_s`. `t0` is the window's start
        (None while the warm-up runs: the state follows the rows, nothing is summed).

        Vectorised over the stretch's events: after each, the batches in flight are
        those launched and not yet returned (the i-th return is the i-th launch's), at
        most `positions` of them, so the latest `positions` launches are all it reads."""
        n, carried = self.positions, len(self._inflight)
        n_l, n_r = len(launches), len(returns)
        times = np.fromiter(chain((b[0] for b in launches), (r[0] for r in returns)), float, n_l + n_r)
        is_return = np.arange(n_l + n_r) >= n_l
        order = np.lexsort((is_return, times))  # time order, a launch before a return at a tie
        times, is_return = times[order], is_return[order]
        # requests of every batch this stretch may see, launch order, after a 0 for "none"
        sizes = np.fromiter(
            chain([0], self._inflight, (b.requests for b in launches)), float, 1 + carried + n_l
        )
        # after each event (and before the first, the state carried in): batches launched and returned
        launched = carried + np.concatenate(([0], np.cumsum(~is_return)))
        returned = np.concatenate(([0], np.cumsum(is_return)))
        if t0 is not None:
            starts = np.maximum(np.concatenate(([self._t], times)), t0)
            dt = np.clip(np.concatenate((times, [upto_s])) - starts, 0.0, None)
            latest = launched[:, None] - 1 - np.arange(n)  # the n latest launches, newest first
            held = latest >= returned[:, None]
            fullest = -np.sort(-np.where(held, sizes[np.maximum(latest + 1, 0)], 0.0), axis=1)
            self.count_s += np.bincount(held.sum(axis=1), weights=dt, minlength=n + 1)
            self.requests_s += dt @ fullest
        first = min(int(returned[-1]), int(launched[-1]))
        self._inflight = [int(x) for x in sizes[1 + first : 1 + int(launched[-1])]]
        self._t = max(self._t, upto_s)

    def means(self, span_s: float) -> list[float]:
        """Mean requests of the k-th fullest batch in flight over a window of `span_s`
        (an empty position counts 0)."""
        return [float(s) / span_s if span_s > 0 else 0.0 for s in self.requests_s]

    def empty_shares(self, span_s: float) -> list[float]:
        """Share of a window of `span_s` with fewer than k batches in flight (position k
        empty), k = 1 .. positions: non-decreasing in k."""
        fewer = np.cumsum(self.count_s[:-1])
        return [min(1.0, float(x) / span_s) if span_s > 0 else 0.0 for x in fewer]


def events(launches: Sequence, returns: Sequence) -> Iterator[tuple[float, int | None]]:
    """Launches (rows: time first, then `requests`) and returns (rows: time first), each
    in time order, merged: (time, the batch's requests) for a launch, (time, None) for
    a return. At a tie the launch goes first, so that a batch returned the instant it
    launched pairs with itself (the i-th return is the i-th launch's)."""
    i = j = 0
    while i < len(launches) or j < len(returns):
        if j == len(returns) or (i < len(launches) and launches[i][0] <= returns[j][0]):
            yield launches[i][0], launches[i].requests
            i += 1
        else:
            yield returns[j][0], None
            j += 1


def occupancy_steps(
    launches: Sequence, returns: Sequence, positions: int
) -> Iterator[tuple[float, list[int]]]:
    """The batches in flight after each launch and return of a kept record, as (time,
    requests fullest first, padded with zeros to `positions`): the step function the
    figures above sum (the trace draws it)."""
    inflight: deque[int] = deque()
    for t, requests in events(launches, returns):
        if requests is not None:
            inflight.append(requests)
        elif inflight:
            inflight.popleft()
        fullest = sorted(inflight, reverse=True)[:positions]
        yield t, fullest + [0] * (positions - len(fullest))

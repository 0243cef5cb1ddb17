"""Saturation of an open-loop run: does the engine keep up with the arrivals?

An open loop (Poisson arrivals or a trace) sends requests whatever the engine does.
If the engine serves fewer per second than arrive, the waiting queue grows without
bound and TTFT grows with the run's length: the run's latency numbers then describe
the run, not a steady state, and the report must say so.

From the recorded requests (arrival, first token and finish times), over the
arrival period [a0, a1] (first to last arrival):

- arrival rate: (n - 1) / (a1 - a0); and over the period's second half, the requests
  that arrived in it / its length, the rate the served rate and the growth are taken
  against (a Poisson run's second half may bring more or fewer than the whole's mean);
- served rate: requests finished in the period's second half (below) / its length;
- queue growth: the slope of the requests in the engine (arrived, not finished) over
  the period's second half, [(a0 + a1) / 2, a1] (the first half fills the engine).
  A stable engine holds a steady number (arrival rate x latency); an overloaded one
  gains the difference between arrivals and completions every second, first as a
  growing batch up to its running cap, then as requests waiting for a first token
  (`waiting_at_last_arrival`).

Rule: overloaded when the requests in the engine grow faster than `GROWTH_SHARE` of
the arrival rate over that half, and the growth over it (slope x its length) is more
than twice the count's Poisson noise at its start (2 sqrt(N + 1)) and at least
`MIN_GROWTH_REQUESTS`: a stable count fluctuates by about its square root. A run shorter
than about two request latencies has not filled yet and reads as overloaded: send
more requests to tell.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

GROWTH_SHARE = 0.10  # growth above 10% of the arrival rate: overloaded
MIN_GROWTH_REQUESTS = 5  # ... and by at least this many requests over the half


@dataclass(frozen=True)
class Saturation:
    """Arrival against service over an open-loop run's arrival period."""

    arrival_rate_req_s: float
    served_rate_req_s: float
    queue_growth_req_s: float
    arrival_rate_half_req_s: float  # arrivals over the second half, which served and growth are over
    in_engine_mid: int  # requests arrived and not finished at the period's midpoint
    in_engine_end: int  # ... at the last arrival
    waiting_at_last_arrival: int  # arrived, no first token yet, at the last arrival
    overloaded: bool

    def text(self) -> str:
        head = "overloaded" if self.overloaded else "keeps up"
        return (
            f"{head}: {self.arrival_rate_req_s:.2f} req/s arrive; over the second half of the arrivals "
            f"{self.arrival_rate_half_req_s:.2f} arrive, {self.served_rate_req_s:.2f} served, "
            f"queue grows {self.queue_growth_req_s:.2f} req/s ({self.in_engine_mid} -> {self.in_engine_end} "
            f"in the engine, {self.waiting_at_last_arrival} waiting "
            "for a first token at the last)"
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "text": self.text()}


class SaturationTally:
    """The figures above, taken as a run goes: fed its arrivals, first tokens and
    finishes in time order, holding a handful of numbers whatever the run's length.
    The arrival period's ends are known before the run (an open loop's arrival plan:
    simulation.py). The least-squares slope is taken on the fly (Welford's running
    means and co-moments) over the same points as np.polyfit would be: every distinct
    time of an arrival or finish in the second half, and its two ends."""

    def __init__(self, first_arrival_s: float, last_arrival_s: float) -> None:
        self.a0, self.a1 = first_arrival_s, last_arrival_s
        self.mid = (first_arrival_s + last_arrival_s) / 2
        self._ends = [self.mid, self.a1]  # the half's ends, not yet passed
        self.arrived = self.finished = self.first_by_end = 0
        self._at_ends: list[tuple[int, int]] = []  # (in engine, finished) at mid, at a1
        self._pending: float | None = None  # the last event's time, if in the half
        self._last_point: float | None = None
        self._n = 0
        self._mx = self._my = self._cxy = self._mxx = 0.0

    def _advance(self, t: float) -> None:
        """Take the points before `t` (the last event's time and the half's ends passed
        since): every event before `t` is in, so each has the count as it stands."""
        count = self.arrived - self.finished
        while True:
            cands = [
                x for x in (self._pending, self._ends[0] if self._ends else None) if x is not None and x < t
            ]
            if not cands:
                return
            p = min(cands)
            if self._pending == p:
                self._pending = None
            if self._ends and self._ends[0] == p:
                self._ends.pop(0)
                self._at_ends.append((count, self.finished))
            if p != self._last_point:
                self._point(p - self.mid, count)
                self._last_point = p

    def _point(self, x: float, y: int) -> None:
        self._n += 1
        dx = x - self._mx
        self._mx += dx / self._n
        self._my += (y - self._my) / self._n
        self._cxy += dx * (y - self._my)
        self._mxx += dx * (x - self._mx)

    def _event(self, t: float) -> None:
        self._advance(t)
        if self.mid <= t <= self.a1:
            self._pending = t

    def arrival(self, t: float) -> None:
        self._event(t)
        self.arrived += 1

    def first_token(self, t: float) -> None:  # moves no count: no point to take
        if t <= self.a1:
            self.first_by_end += 1

    def finish(self, t: float) -> None:
        self._event(t)
        self.finished += 1

    def result(self) -> Saturation | None:
        """The saturation of the events fed so far (None as for `saturation`)."""
        n, a0, a1, mid = self.arrived, self.a0, self.a1, self.mid
        if n < 3 or a1 <= a0:
            return None
        self._advance(float("inf"))
        (n_mid, fin_mid), (n_end, fin_end) = self._at_ends
        rate = (n - 1) / (a1 - a0)
        served = (fin_end - fin_mid) / (a1 - mid)
        arrived_half = ((n_end + fin_end) - (n_mid + fin_mid)) / (a1 - mid)
        growth = self._cxy / self._mxx if self._n >= 3 else (n_end - n_mid) / (a1 - mid)
        gained = growth * (a1 - mid)
        over = growth > GROWTH_SHARE * rate and gained > max(2 * np.sqrt(n_mid + 1), MIN_GROWTH_REQUESTS)
        return Saturation(
            float(rate),
            float(served),
            float(growth),
            float(arrived_half),
            n_mid,
            n_end,
            n - self.first_by_end,
            bool(over),
        )


def saturation(arrival_s: ArrayLike, first_token_s: ArrayLike, finish_s: ArrayLike) -> Saturation | None:
    """The saturation of an open-loop run from its requests' times (seconds). None
    with fewer than 3 requests or all arriving at one instant (no rate to speak of)."""
    arr = np.asarray(arrival_s, dtype=float)
    if len(arr) < 3 or arr.max() <= arr.min():
        return None
    tally = SaturationTally(float(arr.min()), float(arr.max()))
    first, finish = np.asarray(first_token_s, dtype=float), np.asarray(finish_s, dtype=float)
    times = np.concatenate((arr, first, finish))
    kinds = np.repeat([0, 1, 2], [len(arr), len(first), len(finish)])
    feed = (tally.arrival, tally.first_token, tally.finish)
    for i in np.argsort(times, kind="stable"):
        feed[kinds[i]](float(times[i]))
    return tally.result()

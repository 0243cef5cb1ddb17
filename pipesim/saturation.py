"""Saturation of an open-loop run: does the engine keep up with the arrivals?

An open loop (Poisson arrivals or a trace) sends requests whatever the engine does.
If the engine serves fewer per second than arrive, the waiting queue grows without
bound and TTFT grows with the run's length: the run's latency numbers then describe
the run, not a steady state, and the report must say so.

From the recorded requests (arrival, first token and finish times), over the
arrival period [a0, a1] (first to last arrival):

- arrival rate: (n - 1) / (a1 - a0);
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
    in_engine_mid: int  # requests arrived and not finished at the period's midpoint
    in_engine_end: int  # ... at the last arrival
    waiting_at_last_arrival: int  # arrived, no first token yet, at the last arrival
    overloaded: bool

    def text(self) -> str:
        head = "overloaded" if self.overloaded else "keeps up"
        return (
            f"{head}: {self.arrival_rate_req_s:.2f} req/s arrive, {self.served_rate_req_s:.2f} served; "
            f"queue grows {self.queue_growth_req_s:.2f} req/s ({self.in_engine_mid} -> {self.in_engine_end} "
            f"in the engine over the second half of the arrivals, {self.waiting_at_last_arrival} waiting "
            "for a first token at the last)"
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "text": self.text()}


def saturation(arrival_s: ArrayLike, first_token_s: ArrayLike, finish_s: ArrayLike) -> Saturation | None:
    """The saturation of an open-loop run from its requests' times (seconds). None
    with fewer than 3 requests or all arriving at one instant (no rate to speak of)."""
    arr = np.sort(np.asarray(arrival_s, dtype=float))
    first = np.sort(np.asarray(first_token_s, dtype=float))
    fin = np.sort(np.asarray(finish_s, dtype=float))
    n = len(arr)
    if n < 3 or arr[-1] <= arr[0]:
        return None
    a0, a1 = arr[0], arr[-1]
    mid = (a0 + a1) / 2

    def by(times, t):  # how many happened by t (inclusive)
        return int(np.searchsorted(times, t, side="right"))

    rate = (n - 1) / (a1 - a0)
    served = (by(fin, a1) - by(fin, mid)) / (a1 - mid)
    n_mid, n_end = by(arr, mid) - by(fin, mid), by(arr, a1) - by(fin, a1)
    # least-squares slope of the count at every arrival and finish in the half: less
    # noisy than the two ends alone
    t = np.unique(
        np.concatenate((arr[(arr >= mid) & (arr <= a1)], fin[(fin >= mid) & (fin <= a1)], [mid, a1]))
    )
    count = np.searchsorted(arr, t, side="right") - np.searchsorted(fin, t, side="right")
    growth = float(np.polyfit(t, count, 1)[0]) if len(t) >= 3 else (n_end - n_mid) / (a1 - mid)
    gained = growth * (a1 - mid)
    over = growth > GROWTH_SHARE * rate and gained > max(2 * np.sqrt(n_mid + 1), MIN_GROWTH_REQUESTS)
    return Saturation(float(rate), float(served), float(growth), n_mid, n_end, n - by(first, a1), bool(over))

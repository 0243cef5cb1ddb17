"""The box's links as the simulation books them: every directed link a free-at clock.

A TP collective or a PP hop occupies every link it crosses for its duration, first
come first served: it starts when every one of them is free (a SimPy Resource of
capacity one per link, acquired for all of them at once in request order, kept as
each link's free-at time so that a booking costs no event). The pipeline's stages and
hops and data parallelism's replicas book on one `Links`, so transfers that share a
link wait for each other whoever makes them. A wait is recorded as a row (the time
some transfer waited for a busy link).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from ..measure.rows import Recorder


class Links:
    """Free-at clocks of the directed links of one run."""

    __slots__ = ("free_at", "rec")

    def __init__(self, rec: Recorder) -> None:
        self.free_at: dict[Hashable, float] = {}  # link -> when it is next free
        self.rec = rec  # where waits are recorded

    def add(self, links: Iterable[Hashable]) -> None:
        """Links a user will book (free from the start)."""
        for d in links:
            self.free_at.setdefault(d, 0.0)

    def book(self, links: tuple, ready_s: float, seconds: float) -> tuple[float, float]:
        """Occupy `links` for `seconds` from `ready_s` on: (start, end). The transfer
        starts when every link it crosses is free."""
        free = self.free_at
        start = ready_s
        for d in links:
            if free[d] > start:
                start = free[d]
        end = start + seconds
        for d in links:
            free[d] = end
        if start > ready_s:
            self.rec.link_wait.append((ready_s, start))
        return start, end

"""The simulation's clock: a SimPy environment that counts its events.

pipesim touches SimPy's internals here alone (the event queue, an event's value and
outcome), for events that cost no more than SimPy's own: `simpy` is bounded in
pyproject.toml to the versions these are written against and tested with.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush

import simpy
from simpy.events import NORMAL, Event


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules: the simulator's cost
    (physics.md §8), reported as `sim_events`.

    `schedule` is SimPy's own (simpy 4, core.py `Environment.schedule`) with the
    count as the tie-breaking event id: ids increase exactly as SimPy's do, so the
    event order is unchanged, and the count costs no extra call per event."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event: simpy.Event, priority: int = NORMAL, delay: float = 0) -> None:
        self.scheduled = n = self.scheduled + 1
        heappush(self._queue, (self._now + delay, priority, n, event))

    def call_at(self, t: float, callback: Callable[[simpy.Event], object]) -> None:
        """Run `callback(event)` at simulated time `t`: one event, as
        `timeout(t - now).callbacks.append(callback)` schedules it (the same time, to
        the bit, and the same order), without a Timeout's construction: nothing waits
        on it."""
        ev = Event.__new__(Event)
        ev.env, ev.callbacks, ev._value, ev._ok = self, [callback], None, True
        self.scheduled = n = self.scheduled + 1
        heappush(self._queue, (self._now + (t - self._now), NORMAL, n, ev))

"""The simulation's clock: a SimPy environment that counts its events.

pipesim touches SimPy's internals here alone (the event queue, an event's value and
outcome), for events that cost no more than SimPy's own: `simpy` is bounded in
pyproject.toml to the versions these are written against and tested with.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from heapq import heappush

import simpy
from simpy.events import NORMAL, Event, EventPriority


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules: the simulator's cost
    (physics.md §8), reported as `sim_events`.

    `schedule` is SimPy's own (simpy 4, core.py `Environment.schedule`) with the
    count as the tie-breaking event id: ids increase exactly as SimPy's do, so the
    event order is unchanged, and the count costs no extra call per event."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event: simpy.Event, priority: EventPriority = NORMAL, delay: float = 0) -> None:
        self.scheduled = n = self.scheduled + 1
        heappush(self._queue, (self._now + delay, priority, n, event))

    def call_at(self, t: float, callback: Callable[[simpy.Event], None]) -> None:
        """Run `callback(event)` at simulated time `t`: one event, as
        `timeout(t - now).callbacks.append(callback)` schedules it (the same time, to
        the bit, and the same order), without a Timeout's construction: nothing waits
        on it."""
        ev = Event.__new__(Event)
        ev.env, ev.callbacks, ev._value, ev._ok = self, [callback], None, True
        self.scheduled = n = self.scheduled + 1
        heappush(self._queue, (self._now + (t - self._now), NORMAL, n, ev))

    def succeed_at(self, event: simpy.Event, t: float, value: Callable[[], object]) -> None:
        """Trigger `event` at simulated time `t` (one event) with the value `value()`
        computes then, before any process waiting on it resumes: `Event.succeed` with a
        delay (simpy 4, events.py `Event.succeed`: set the outcome, then schedule), the
        value filled in by the event's first callback."""

        def fill(ev: simpy.Event) -> None:
            ev._value = value()

        event.callbacks.insert(0, fill)
        event._ok, event._value = True, None
        self.schedule(event, NORMAL, t - self._now)


class Channel:
    """A FIFO hand-off between processes (a data-parallel rank's batches,
    dataparallel.py). Cheaper than `simpy.Store`: a put costs no event, a take costs
    one only when the taker has to wait (physics.md §8: events per simulated step
    decide the simulator's speed)."""

    __slots__ = ("env", "items", "waiter")

    def __init__(self, env: simpy.Environment):
        self.env: simpy.Environment = env
        self.items: deque = deque()
        self.waiter: simpy.Event | None = None

    def put(self, item: object) -> None:
        self.items.append(item)
        if self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter.succeed()

    def wait(self) -> simpy.Event:
        self.waiter = self.env.event()
        return self.waiter

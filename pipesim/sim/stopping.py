"""When a run has measured enough, and how sure its throughput is (steady.py's rules).

A closed loop warms up on its first requests (as many as the engine admits at once),
then measures at least `measure` completions, and goes on until the throughput's 95%
confidence half-width (batch means over the measured requests in completion order) is
within `ci_target` of the mean, or `max_measure` have completed; with no target it
measures exactly `measure`. A run whose requests repeat (steady.period: a deterministic
run's limit cycle) stops at the end of a whole period, so that every figure of its
window, not only the throughput, is the long run's. Open loops and traces run every
request (no target).

The rule owns its sample, its confidence interval and the period it found: the run's
`Record` carries its `Verdict`, which the metrics read instead of working it out again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..measure.request_tally import RequestTally
from ..measure.steady import closed_loop_ci, period


class Verdict(NamedTuple):
    """A closed loop's measured throughput: its mean and 95% half-width (tok/s), and the
    period it repeats with (P requests, the slot labels moved on by `shift` each
    period; (0, 0): none seen)."""

    mean_tok_s: float
    half_width_tok_s: float
    period: tuple[int, int]


class StoppingRule:
    """The run's stopping rule (module docstring). `load()` is the mean number of
    admitted requests over the window so far, what a closed loop with more clients
    than the engine admits (`queued`) measures its rate on; otherwise the clients,
    `concurrency`."""

    def __init__(
        self,
        *,
        warmup: int,
        measure: int,
        max_measure: int | None,
        ci_target: float | None,
        concurrency: int | None,
        queued: bool,
        slots: int,
        periodic: bool,
        load: Callable[[], float],
    ) -> None:
        self.warmup = warmup
        self.target = warmup + measure
        self.cap = warmup + max(max_measure or measure, measure)
        self.ci_target = ci_target
        self.concurrency, self.queued, self.slots = concurrency, queued, slots
        # a data-parallel run's rows do not say every label a figure is kept by (its
        # rank), so a period seen in them may hand work on to the next rank unseen
        self.periodic = periodic
        self._load = load
        self._check_every = max(1, measure // 8)
        self._stop_measured: int | None = None  # a repeating run's whole periods
        self.period: tuple[int, int] | None = None  # (P, slot shift) it stopped at

    def expected(self, completed: int) -> int:
        """The most completions (warm-up included) the run may still need, as it stands
        after `completed`: the target; past it, the whole period it waits for, else the
        cap (it stops sooner once its CI is within target). A progress bar's total: its
        ETA is then never too early, at worst too late."""
        if completed < self.target or self.ci_target is None:
            return self.target
        if self._stop_measured is not None:
            return min(self.cap, max(completed + 1, self.warmup + self._stop_measured))
        return self.cap

    def done(self, completed: int, requests: RequestTally) -> bool:
        """Enough measured, with `completed` requests finished (warm-up included): the
        target reached and then no CI target, the cap reached, or the CI within
        target (at a whole period, for a run that repeats)."""
        if completed < self.target:
            return False
        if self.ci_target is None or completed >= self.cap:
            return True
        at_period = self._stop_measured is not None and requests.measured >= self._stop_measured
        if not at_period and (completed - self.target) % self._check_every:
            return False
        self._stop_measured = None
        out, latency_s = requests.closed_loop_sample(self.queued)
        per = self._period(requests) if self.periodic else None
        mean, half = self._ci(out, latency_s, per[0] if per else 0)
        if not (mean > 0 and half <= self.ci_target * mean):
            return False
        if per is None:
            return True
        if len(out) % per[0] == 0:
            self.period = per
            return True
        self._stop_measured = (len(out) // per[0] + 1) * per[0]
        return False

    def verdict(self, requests: RequestTally) -> Verdict:
        """The throughput of the requests measured when the run stopped (over whole
        periods when it stopped at one)."""
        out, latency_s = requests.closed_loop_sample(self.queued)
        period = self.period or (0, 0)
        mean, half = self._ci(out, latency_s, period[0])
        return Verdict(mean, half, period)

    def _period(self, requests: RequestTally) -> tuple[int, int] | None:
        """The measured requests' period and slot rotation (steady.period), on every
        time a request's figures read, its slot and its output."""
        rows = requests.rows()
        assert rows is not None, "a closed loop keeps its rows"
        start = rows["arrival_s"]
        times = np.column_stack([rows[c] - start for c in ("admit_s", "first_token_s", "finish_s")])
        return period(rows["output_len"], times, rows["slot"], self.slots)

    def _ci(self, out: np.ndarray, latency_s: np.ndarray, period_requests: int) -> tuple[float, float]:
        """Closed-loop output rate and its 95% half-width from the measured requests."""
        clients = self._load() if self.queued else self.concurrency
        assert clients is not None, "a closed loop's clients: only a closed loop measures a CI"
        return closed_loop_ci(clients, out, latency_s, period_requests)

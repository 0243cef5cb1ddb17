"""Steady state: when a run has measured enough, and how sure the estimate is.

Closed loop (C clients, no think time): by the renewal-reward theorem the output
rate is C x E[output tokens] / E[request latency]. Requests in completion order are
cut into `BATCHES` batches; each batch's C x sum(output) / sum(latency) is one
sample, and the 95% half-width is t(0.975, BATCHES-1) x std / sqrt(BATCHES). This
converges even when a fixed-length closed loop runs in synchronized waves, where
equal-time batches would each see a different phase of the wave.

A closed loop of fixed lengths is deterministic, and it often settles into a limit
cycle: its requests repeat, in completion order, every P of them (each client's
latency alternating between a long and a short round, say). Batches that cut through
a cycle then differ by the cycle's phase, not by chance, and the batch means report
a spread the estimate does not have. When the measured requests repeat with a
period P (`period`: every request's output and times equal those P earlier, for
at least two whole periods), the batch is one period: the estimate is taken over
the window's whole periods, where it is the cycle's long-run rate, and the
half-width comes from the per-period samples (their spread is float rounding).
A run that repeats stops at a whole period (simulation.py, which finds the period
once a check and hands it on: `Record.period`, `Result.period_requests`), so every
figure of its window is the long run's. Its slots may repeat only up to a rotation of their labels
(the busy slots move on by `shift` each period): a figure kept per slot is then the
long run's once averaged over the labels the rotation visits (`slot_orbits`).

Closed loop with more clients than the engine admits (C above its running cap or
its KV capacity): the extra clients wait in the engine's queue and the run is sized
by the admitted requests, not by C (api.simulate). The same renewal-reward estimate
is then taken on the engine alone: L x E[output tokens] / E[time admitted], L the
mean number admitted over the window (Little's law on the engine, which holds with
or without a queue in front of it). Every client's latency adds the queue wait, by
Little's law on the whole closed loop (no think time): E[latency] = C / request rate,
so the mean wait is E[time admitted] x (C / L - 1) (`queue_wait_s`).

Open loop and traces: the window is cut into `BATCHES` equal spans of time and each
span's output rate is one sample. The token returns are kept as a `TimeHistogram`:
exactly while there are at most `EXACT_POINTS` of them, then in `HISTOGRAM_BINS`
equal bins from time 0 (memory flat in the run's length), where a span's tokens are
read off the cumulative count, interpolated within the bins its edges cut: each edge
is then off by at most one bin's tokens, a 1/HISTOGRAM_BINS share of the run.
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

BATCHES = 10
EXACT_POINTS = 65_536  # token returns kept exactly (1 MiB), then binned
HISTOGRAM_BINS = 4096
# Student's t, 97.5% quantile, for 1..9 degrees of freedom; more samples than
# BATCHES (whole periods) take the 9-degree value, which is wider than theirs
T_975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157)
PERIOD_RTOL = 1e-9  # a repeated latency: equal but for the rounding of growing times
PERIOD_PROBE = 64  # requests compared at every candidate period before the full check
PERIOD_CANDIDATES = 16  # the smallest candidates that pass the probe, checked in full
PERIOD_BLOCK = 256  # candidate lags probed at once


def _half_width(samples: np.ndarray) -> float:
    t = T_975[min(len(samples), BATCHES) - 2]
    return t * float(samples.std(ddof=1)) / np.sqrt(len(samples))


def period(
    output_tokens: ArrayLike, times_s: ArrayLike, slot: ArrayLike | None = None, slots: int = 1
) -> tuple[int, int] | None:
    """(P, shift) for requests that repeat in completion order, else None. P is the
    smallest lag, at most half the requests, at which each request's output equals,
    and its times (`times_s`: one per request, its latency, or a row of them, say
    latency and time to first token) match within PERIOD_RTOL, those of the request
    P earlier. `slot` (each request's micro-batch slot, -1 for none, of `slots`): the
    slots must repeat too, up to one rotation of their labels, slot -> slot + shift
    mod `slots` (the engine fills its slots in turn, so a cycle may hand its work on
    to the next slot); shift is 0 without one. Only the PERIOD_CANDIDATES smallest
    lags at which the last PERIOD_PROBE requests repeat are checked whole: a run that
    repeats with none of them is treated as one that does not repeat (plain batch
    means, the conservative answer)."""
    out = np.asarray(output_tokens, dtype=float)
    lat = np.asarray(times_s, dtype=float)
    lat = lat.reshape(len(lat), -1)
    n = len(lat)
    if n < 2:
        return None

    def same(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        near = np.abs(lat[i] - lat[j]) <= PERIOD_RTOL * np.abs(lat[j])
        return (out[i] == out[j]) & near.all(axis=-1)

    probe = n - 1 - np.arange(min(PERIOD_PROBE, n // 2))  # the last requests
    candidates: list[int] = []
    for first in range(1, n // 2 + 1, PERIOD_BLOCK):  # lags in ascending blocks
        lags = np.arange(first, min(first + PERIOD_BLOCK, n // 2 + 1))
        for i in probe:
            lags = lags[same(np.full(len(lags), i), i - lags)]
            if not len(lags):
                break
        candidates += lags.tolist()
        if len(candidates) >= PERIOD_CANDIDATES:
            break
    sl = None if slot is None else np.asarray(slot, dtype=np.int64)
    for p in candidates[:PERIOD_CANDIDATES]:  # bounded work: beyond them, no period is claimed
        a, b = lat[p:], lat[:-p]
        if not (np.array_equal(out[p:], out[:-p]) and (np.abs(a - b) <= PERIOD_RTOL * np.abs(b)).all()):
            continue
        if sl is None or slots <= 1:
            return int(p), 0
        a, b = sl[p:], sl[:-p]
        if not np.array_equal(a < 0, b < 0):
            continue
        shift = (a - b) % slots
        shift = shift[a >= 0]
        if len(shift) and (shift != shift[0]).any():
            continue
        return int(p), int(shift[0]) if len(shift) else 0
    return None


def slot_orbits(values: ArrayLike, shift: int) -> np.ndarray:
    """Per-slot sums over a window of whole periods in which the labels move on by
    `shift` each period, as a window of whole rotations would hold them: a slot's
    label passes through its orbit (the slots j + i x shift mod slots), so each slot
    takes its orbit's mean. Ratios of two such sums are the long run's per slot."""
    v = np.asarray(values, dtype=float)
    g = math.gcd(shift, len(v))  # the orbits are the residue classes mod g
    if g == len(v):
        return v
    means = np.array([v[j::g].mean() for j in range(g)])
    return means[np.arange(len(v)) % g]


def closed_loop_ci(
    concurrency: float, output_tokens: ArrayLike, latency_s: ArrayLike, period_requests: int = 0
) -> tuple[float, float]:
    """(output tok/s, 95% half-width) from completed requests in completion order: over
    the whole periods of `period_requests` when they repeat (`period`; at least two of
    them), else in BATCHES batches. `concurrency`: the clients, or the engine's mean
    load when more clients queue than it admits (stopping.py)."""
    out = np.asarray(output_tokens, dtype=float)
    lat = np.asarray(latency_s, dtype=float)
    if len(out) < BATCHES or lat.sum() <= 0:
        return float("nan"), float("inf")
    p = period_requests
    if not p or len(out) < 2 * p:
        groups = np.array_split(np.arange(len(out)), BATCHES)
    else:
        k = len(out) // p
        out, lat = out[: k * p], lat[: k * p]
        groups = np.split(np.arange(k * p), k)
    samples = np.array([concurrency * out[g].sum() / lat[g].sum() for g in groups])
    return concurrency * out.sum() / lat.sum(), _half_width(samples)


def queue_wait_s(concurrency: int, engine_load: float, mean_admitted_s: float) -> float:
    """Mean time a closed-loop request waits before admission, in steady state: the
    request rate is L / E[time admitted] (Little on the engine) and E[latency] is
    C / request rate (Little on the closed loop)."""
    return mean_admitted_s * (concurrency / engine_load - 1.0)


def window_ci(tokens: ArrayLike, t0: float, t1: float) -> tuple[float, float]:
    """(output tok/s, 95% half-width) over [t0, t1] from (time, tokens) records."""
    if t1 <= t0:
        return float("nan"), float("inf")
    a = np.asarray(tokens, dtype=float).reshape(-1, 2)
    if len(a) == 0:
        return float("nan"), float("inf")
    inside = (a[:, 0] > t0) & (a[:, 0] <= t1)
    edges = np.linspace(t0, t1, BATCHES + 1)
    rates = np.histogram(a[inside, 0], bins=edges, weights=a[inside, 1])[0] / ((t1 - t0) / BATCHES)
    return float(a[inside, 1].sum() / (t1 - t0)), _half_width(rates)


class TimeHistogram:
    """(time, weight) points at times >= 0 in bounded memory (the module docstring):
    exact while at most `exact_points`, then `bins` equal bins from time 0, each twice
    as wide (neighbours merged) whenever a point falls past the last."""

    def __init__(self, exact_points: int = EXACT_POINTS, bins: int = HISTOGRAM_BINS) -> None:
        self.exact_points, self.nbins = exact_points, bins
        self._t, self._w = array("d"), array("d")
        self._bins: np.ndarray | None = None
        self._width = 0.0
        self.total = 0.0

    @property
    def exact(self) -> bool:
        return self._bins is None

    def add(self, t_s: float, weight: float) -> None:
        self.total += weight
        if self._bins is None:
            self._t.append(t_s)
            self._w.append(weight)
            if len(self._t) > self.exact_points:
                self._to_bins()
            return
        while t_s >= self._width * self.nbins:
            self._double()
        self._bins[min(int(t_s / self._width), self.nbins - 1)] += weight

    def _to_bins(self) -> None:
        t, w = np.frombuffer(self._t), np.frombuffer(self._w)
        self._width = max(float(t.max()), 1e-9) * 2 / self.nbins
        self._bins = np.zeros(self.nbins)
        np.add.at(self._bins, (t / self._width).astype(np.int64), w)
        self._t, self._w = array("d"), array("d")

    def _double(self) -> None:
        b = self._bins
        assert b is not None  # called only once the points are binned
        half = b.reshape(-1, 2).sum(axis=1)
        b[: len(half)], b[len(half) :] = half, 0.0
        self._width *= 2

    @property
    def bin_s(self) -> float:
        """The bins' width (0 while the points are kept)."""
        return self._width

    def span_weights(self, t0: float, t1: float) -> np.ndarray:
        """The weight in each of `BATCHES` equal spans of [t0, t1], read off the bins'
        cumulative weight (interpolated inside the bin each edge cuts)."""
        assert self._bins is not None, "span_weights reads the bins: the points are no longer kept"
        cum = np.concatenate((np.zeros(1), np.cumsum(self._bins)))
        edges = np.linspace(t0, t1, BATCHES + 1) / self._width
        return np.diff(np.interp(edges, np.arange(self.nbins + 1), cum))

    def window_ci(self, t0: float, t1: float) -> tuple[float, float]:
        """`window_ci` of the points: exact while they are kept, else from the bins."""
        if self._bins is None:
            return window_ci(np.column_stack((np.frombuffer(self._t), np.frombuffer(self._w))), t0, t1)
        if t1 <= t0:
            return float("nan"), float("inf")
        rates = self.span_weights(t0, t1) / ((t1 - t0) / BATCHES)
        return self.total / (t1 - t0), _half_width(rates)

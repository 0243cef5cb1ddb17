"""Steady state: when a run has measured enough, and how sure the estimate is.

Closed loop (C clients, no think time): by the renewal-reward theorem the output
rate is C x E[output tokens] / E[request latency]. Requests in completion order are
cut into `BATCHES` batches; each batch's C x sum(output) / sum(latency) is one
sample, and the 95% half-width is t(0.975, BATCHES-1) x std / sqrt(BATCHES). This
converges even when a fixed-length closed loop runs in synchronized waves, where
equal-time batches would each see a different phase of the wave.

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

from array import array
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

BATCHES = 10
EXACT_POINTS = 65_536  # token returns kept exactly (1 MiB), then binned
HISTOGRAM_BINS = 4096
T_975_DOF9 = 2.262157  # Student's t, 97.5% quantile, 9 degrees of freedom


def _half_width(samples: np.ndarray) -> float:
    return T_975_DOF9 * float(samples.std(ddof=1)) / np.sqrt(len(samples))


def closed_loop_ci(concurrency: int, output_tokens: ArrayLike, latency_s: ArrayLike) -> tuple[float, float]:
    """(output tok/s, 95% half-width) from completed requests in completion order."""
    out = np.asarray(output_tokens, dtype=float)
    lat = np.asarray(latency_s, dtype=float)
    if len(out) < BATCHES or lat.sum() <= 0:
        return float("nan"), float("inf")
    groups = np.array_split(np.arange(len(out)), BATCHES)
    samples = np.array([concurrency * out[g].sum() / lat[g].sum() for g in groups])
    return concurrency * out.sum() / lat.sum(), _half_width(samples)


def queue_wait_s(concurrency: int, engine_load: float, mean_admitted_s: float) -> float:
    """Mean time a closed-loop request waits before admission, in steady state: the
    request rate is L / E[time admitted] (Little on the engine) and E[latency] is
    C / request rate (Little on the closed loop)."""
    return mean_admitted_s * (concurrency / engine_load - 1.0)


def window_ci(tokens: ArrayLike, t0: float, t1: float) -> tuple[float, float]:
    """(output tok/s, 95% half-width) over [t0, t1] from (time, tokens) records."""
    if t1 <= t0 or len(tokens) == 0:
        return float("nan"), float("inf")
    a = np.asarray(tokens, dtype=float).reshape(-1, 2)
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
        cum = np.concatenate(([0.0], np.cumsum(self._bins)))
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

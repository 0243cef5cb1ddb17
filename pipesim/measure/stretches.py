"""An open loop's measured requests cut into stretches of consecutive arrivals: the
workload part of its band from the run itself (report/uncertainty.py), no extra run.

A closed loop's band reads its kept rows, a stretch at a time; an open loop keeps no
row (request_tally.py), so its stretches are folded as the requests finish: the run's N
requests, in arrival order, fall into k = STRETCHES stretches of N / k each (fewer when
N is small: at least MIN_PER_STRETCH requests a stretch). A stretch of consecutive
arrivals is a shorter run of the same arrival process, so each is one sample of every
headline figure: output throughput as its output tokens over the time its requests took
to arrive (since the previous stretch's last arrival; the first from the window's
start), per-request speed as its requests' mean, the TTFT and TPOT percentiles of its
requests (`Percentiles`, exact up to a k-th of the run's exact limit each, so the run's
memory stays bounded). The whole run is about the mean of its k stretches: the spread of
a whole run's figure is theirs / sqrt(k) (`spread`). An overloaded run's throughput is
set by the engine, not the arrivals: its stretches' throughput overstates that spread.
"""

from __future__ import annotations

from array import array

import numpy as np

from .sketch import EXACT_VALUES, Percentiles

STRETCHES = 8  # samples of an open loop's figures: 7 degrees of freedom for their spread
MIN_PER_STRETCH = 2  # a stretch of one request has no spread of its own


def stretch_count(requests: int) -> int:
    """How many stretches a run of `requests` measured requests is cut into (0: too
    few for a spread)."""
    k = min(STRETCHES, requests // MIN_PER_STRETCH)
    return k if k >= 2 else 0


class StretchTally:
    """The stretches of a run expected to measure `requests` requests, filled as they
    finish (`add`, each by its arrival index); `samples` reads them once the run is over."""

    def __init__(self, requests: int) -> None:
        self.requests = requests
        self.k = stretch_count(requests)
        k = self.k
        self.count = array("q", [0] * k)
        self.tokens = array("d", [0.0] * k)
        self.last_arrival_s = array("d", [0.0] * k)
        self.speed_sum = array("d", [0.0] * k)
        self.speed_count = array("q", [0] * k)
        exact = max(1, EXACT_VALUES // max(k, 1))
        self.ttft_ms = [Percentiles(exact) for _ in range(k)]
        self.tpot_ms = [Percentiles(exact) for _ in range(k)]

    def add(
        self,
        index: int,
        arrival_s: float,
        ttft_ms: float,
        tpot_ms: float | None,
        decode_tok_s: float | None,
        out: int,
    ) -> None:
        """One measured request, the `index`-th to arrive (0-based)."""
        if not self.k:
            return
        j = min(index * self.k // self.requests, self.k - 1)
        self.count[j] += 1
        self.tokens[j] += out
        self.last_arrival_s[j] = max(self.last_arrival_s[j], arrival_s)
        self.ttft_ms[j].add(ttft_ms)
        if tpot_ms is not None:
            self.tpot_ms[j].add(tpot_ms)
        if decode_tok_s is not None:
            self.speed_sum[j] += decode_tok_s
            self.speed_count[j] += 1

    def samples(self, start_s: float) -> dict[str, list[float]]:
        """Headline metric -> one value per stretch that holds a request (the window
        starts at `start_s`); empty when the run is too short for stretches."""
        out: dict[str, list[float]] = {}
        prev = start_s
        for j in range(self.k):
            if not self.count[j]:
                continue
            span = self.last_arrival_s[j] - prev
            prev = self.last_arrival_s[j]
            speeds = self.speed_count[j]
            values = {
                "output_throughput_tok_s": self.tokens[j] / span if span > 0 else float("nan"),
                "per_request_tok_s": self.speed_sum[j] / speeds if speeds else float("nan"),
                "ttft_ms_p50": self.ttft_ms[j].percentile(50),
                "ttft_ms_p99": self.ttft_ms[j].percentile(99),
                "tpot_ms_p50": self.tpot_ms[j].percentile(50),
                "tpot_ms_p99": self.tpot_ms[j].percentile(99),
            }
            for m, v in values.items():
                out.setdefault(m, []).append(float(v))
        return out


def spread(samples: list[float], z: float) -> float:
    """z x the standard deviation of a whole run's mean of `samples`, relative to their
    mean: sigma / sqrt(k), sigma from successive differences (von Neumann's mean square
    successive difference: sigma^2 = sum (x[j+1] - x[j])^2 / 2(k - 1)), which a stationary
    run's stretches estimate as the standard deviation does and a run that fills up or
    drains (its early stretches emptier than its late ones) does not inflate; 0 with
    fewer than two finite samples or a zero mean."""
    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2 or x.mean() == 0:
        return 0.0
    sigma = np.sqrt(np.sum(np.diff(x) ** 2) / (2 * (len(x) - 1)))
    return float(z * sigma / np.sqrt(len(x)) / abs(x.mean()))

"""Percentiles of a stream in bounded memory, with a stated relative error.

A run that folds its requests into running figures as they finish (instead of keeping
every request) still has to report TTFT / TPOT / E2E percentiles. `QuantileSketch`
is a log-binned histogram (the DDSketch construction: Masson, Rim and Lee, "DDSketch:
a fast and fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019):
a positive value x falls in bin i = ceil(log_gamma(x)), the bin (gamma^(i-1), gamma^i],
and every value of bin i is read back as 2 gamma^i / (gamma + 1). That reading is
within

    REL_ERROR = (gamma - 1) / (gamma + 1)

of every value of the bin, relative to the value. So the k-th smallest value read
from the sketch (`order_stat`) is within REL_ERROR of the true k-th smallest: the
true one lies in the bin where the counts reach k. Its `percentile` follows the
module's `percentile` (np.percentile's linear rule): it interpolates between the two
order statistics around (n - 1) q / 100, and an interpolation of two readings each
within REL_ERROR of values of one sign is within REL_ERROR of the interpolated
value. Negative values are binned by their magnitude, zero exactly; the smallest and
largest values are kept exact, and readings are clamped to them.

Memory: one counter per occupied bin, whatever the number of values. Bins span a
ratio of gamma per bin, so values within a ratio of gamma^MAX_BINS of each other
(about 10^17 at the default error) fit; beyond that the bins of the smallest
magnitudes are merged into their neighbour (the DDSketch collapse), which keeps the
bound for the large values (the upper percentiles a latency report reads) and gives
it up for the smallest.

`Percentiles` is what a run uses: it keeps the values exactly while there are at most
`EXACT_VALUES` of them (the percentiles then equal `percentile`'s), and moves
them into a sketch past that.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

REL_ERROR = 0.005  # the stated bound: every percentile within 0.5% of the exact one
MAX_BINS = 4096  # per sign: with REL_ERROR 0.5%, values spanning a ratio of ~1e17
EXACT_VALUES = 65_536  # values a run keeps exactly (512 KiB) before it sketches them


def percentile(values: ArrayLike, q: float) -> float:
    """np.percentile's default (linear) rule, q in percent: the sorted values
    interpolated at (n - 1) q / 100, numpy's lerp included (_function_base_impl.py
    `_lerp`), computed directly: np.percentile calls np.unique, which imports
    numpy.ma (tens of milliseconds of a prediction)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if not n:
        return float("nan")
    x = np.sort(x)
    pos = (n - 1) * (q / 100)
    lo = int(pos)
    t = pos - lo
    if lo + 1 >= n:
        return float(x[-1])
    a, b = float(x[lo]), float(x[lo + 1])
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


class QuantileSketch:
    """Count, mean and percentiles of the values added, in bounded memory."""

    __slots__ = (
        "rel_error",
        "max_bins",
        "_gamma",
        "_log_gamma",
        "_pos",
        "_neg",
        "zeros",
        "count",
        "total",
        "min",
        "max",
    )

    def __init__(self, rel_error: float = REL_ERROR, max_bins: int = MAX_BINS) -> None:
        if not 0 < rel_error < 1:
            raise ValueError(f"rel_error {rel_error!r}: must lie strictly between 0 and 1")
        if max_bins < 2:
            raise ValueError(f"max_bins {max_bins!r}: must be at least 2")
        self.rel_error, self.max_bins = rel_error, max_bins
        self._gamma = (1 + rel_error) / (1 - rel_error)
        self._log_gamma = math.log(self._gamma)
        self._pos: dict[int, int] = {}  # bin -> count, positive values
        self._neg: dict[int, int] = {}  # bin of |x| -> count, negative values
        self.zeros = 0
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, x: float) -> None:
        """Add one finite value."""
        if not math.isfinite(x):
            raise ValueError(f"value {x!r}: a sketch takes finite numbers only")
        self.count += 1
        self.total += x
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x
        if x > 0:
            store = self._pos
        elif x < 0:
            store, x = self._neg, -x
        else:
            self.zeros += 1
            return
        i = math.ceil(math.log(x) / self._log_gamma)
        store[i] = store.get(i, 0) + 1
        if len(store) > self.max_bins:
            self._collapse(store)

    def extend(self, values: Iterable[float]) -> None:
        for x in values:
            self.add(float(x))

    def _collapse(self, store: dict[int, int]) -> None:
        """Merge the bin of smallest magnitude into the next one (bounded memory)."""
        low = sorted(store)[:2]
        store[low[1]] += store.pop(low[0])

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def bins(self) -> int:
        """Counters held (the sketch's memory, in bins)."""
        return len(self._pos) + len(self._neg)

    def _reading(self, i: int) -> float:
        return 2 * self._gamma**i / (self._gamma + 1)

    def order_stat(self, k: int) -> float:
        """The k-th smallest value added (0-based), within `rel_error` of the exact one."""
        if not 0 <= k < self.count:
            raise IndexError(f"order statistic {k} of {self.count} values")
        if k == 0:
            return self.min
        if k == self.count - 1:
            return self.max
        seen = 0
        for i in sorted(self._neg, reverse=True):  # most negative first
            seen += self._neg[i]
            if seen > k:
                return min(max(-self._reading(i), self.min), self.max)
        seen += self.zeros
        if seen > k:
            return 0.0
        for i in sorted(self._pos):
            seen += self._pos[i]
            if seen > k:
                return min(max(self._reading(i), self.min), self.max)
        return self.max  # not reached: the counts add up to `count`

    def percentile(self, q: float) -> float:
        """`percentile`'s rule (np.percentile, linear) on the sketch's order
        statistics, q in percent; nan when empty."""
        n = self.count
        if not n:
            return float("nan")
        pos = (n - 1) * (q / 100)
        lo = int(pos)
        t = pos - lo
        if lo + 1 >= n:
            return self.max
        a, b = self.order_stat(lo), self.order_stat(lo + 1)
        d = b - a
        return b - d * (1 - t) if t >= 0.5 else a + d * t


class Percentiles:
    """Count, mean and percentiles of a stream: exact while it holds at most
    `exact_values` values, then a `QuantileSketch` (each percentile within REL_ERROR)."""

    __slots__ = ("exact_values", "_values", "sketch")

    def __init__(self, exact_values: int | None = None) -> None:
        self.exact_values = EXACT_VALUES if exact_values is None else exact_values
        self._values = array("d")  # the values while exact; emptied once they are sketched
        self.sketch: QuantileSketch | None = None  # None: exact

    def add(self, x: float) -> None:
        """Add one finite value."""
        if self.sketch is not None:
            self.sketch.add(x)
            return
        self._values.append(x)
        if len(self._values) > self.exact_values:
            self.sketch = QuantileSketch()
            self.sketch.extend(self._values)
            self._values = array("d")

    @property
    def exact(self) -> bool:
        return self.sketch is None

    @property
    def count(self) -> int:
        return self.sketch.count if self.sketch is not None else len(self._values)

    @property
    def mean(self) -> float:
        if self.sketch is not None:
            return self.sketch.mean
        return float(np.frombuffer(self._values).mean()) if self._values else float("nan")

    def percentile(self, q: float) -> float:
        """`percentile`'s rule, q in percent; nan when empty."""
        if self.sketch is not None:
            return self.sketch.percentile(q)
        return percentile(np.frombuffer(self._values), q)

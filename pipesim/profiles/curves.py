"""Interpolation in measured latency tables.

Inside a table's range: piecewise-linear between measured points (exact at every
measured point). Above the largest measured size: proportional scaling of the last
point (time ~ size once an operation is bandwidth- or compute-bound). Below the
smallest: the smallest point's latency (a kernel cannot run faster than its launch).

Each lookup can also say how it was answered (its provenance): "measured" at a
measured point, "interpolated" between points, "extrapolated" outside the measured
range; a lookup over several axes is as weak as its weakest axis.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

# Table provenances, from strongest to weakest.
TABLE_PROVENANCE = ("measured", "interpolated", "extrapolated")
_RANK = {p: i for i, p in enumerate(TABLE_PROVENANCE)}


def weakest(*tags: str) -> str:
    """The weakest of table provenances (extrapolated > interpolated > measured)."""
    return max(tags, key=_RANK.__getitem__)


def grid_provenance(grid: list[float], x: float) -> str:
    """How a value at x is read from sorted measured sizes `grid`."""
    if x < grid[0] or x > grid[-1]:
        return "extrapolated"
    return "measured" if grid[bisect_left(grid, x)] == x else "interpolated"


class Curve:
    """Latency as a function of one size, from measured (size, latency) points."""

    __slots__ = ("xs", "ys")

    def __init__(self, xs: ArrayLike, ys: ArrayLike) -> None:
        xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        keep = ~(np.isnan(xs) | np.isnan(ys))
        order = np.argsort(xs[keep])
        self.xs = [float(v) for v in xs[keep][order]]
        self.ys = [float(v) for v in ys[keep][order]]
        if not self.xs:
            raise ValueError("a curve needs at least one measured point")

    @classmethod
    def from_sorted(cls, xs: Iterable[float], ys: Iterable[float]) -> Curve:
        """A curve from points already sorted by x, with no NaN (checked tables)."""
        c = cls.__new__(cls)
        c.xs, c.ys = [float(v) for v in xs], [float(v) for v in ys]
        return c

    def provenance(self, x: float) -> str:
        return grid_provenance(self.xs, x)

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * x / xs[-1]
        i = bisect_right(xs, x) - 1
        w = (x - xs[i]) / (xs[i + 1] - xs[i])
        return ys[i] + w * (ys[i + 1] - ys[i])


def bracket(grid: list[float], x: float) -> list[tuple[int, float]]:
    """Grid indices and weights that interpolate at x; outside the grid, the edge
    point with a proportional scale factor (weight = x / edge)."""
    if x <= grid[0]:
        return [(0, 1.0)]
    if x >= grid[-1]:
        return [(len(grid) - 1, x / grid[-1])]
    i = bisect_right(grid, x) - 1
    if grid[i] == x:
        return [(i, 1.0)]
    w = (x - grid[i]) / (grid[i + 1] - grid[i])
    return [(i, 1.0 - w), (i + 1, w)]


class Curves(Mapping[tuple, Curve]):
    """{key: Curve} over parallel arrays sorted by key, then size: each curve is built
    the first time it is read (a GEMM table holds thousands; a run reads a few)."""

    def __init__(self, keys: np.ndarray, xs: np.ndarray, ys: np.ndarray):
        change = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
        bounds = np.concatenate(([0], change, [len(xs)])).tolist() if len(xs) else [0]
        self._xs, self._ys = xs, ys
        starts = keys[bounds[:-1]].tolist()
        self._spans = dict(zip(map(tuple, starts), zip(bounds[:-1], bounds[1:])))
        self._built: dict = {}

    def __getitem__(self, key: tuple) -> Curve:
        curve = self._built.get(key)
        if curve is None:
            a, b = self._spans[key]
            curve = self._built[key] = Curve.from_sorted(self._xs[a:b], self._ys[a:b])
        return curve

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def __contains__(self, key: object) -> bool:
        return key in self._spans


def group_curves(keys: np.ndarray, xs: ArrayLike, ys: ArrayLike) -> Curves:
    """{key: Curve} from parallel arrays, one curve per distinct key row.

    `keys` is a 2-D array (one column per key field); much faster than a pandas
    groupby for the thousands of small groups of a GEMM table."""
    keys, xs, ys = np.asarray(keys), np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    order = np.lexsort((xs,) + tuple(keys[:, i] for i in reversed(range(keys.shape[1]))))
    return Curves(keys[order], xs[order], ys[order])


class Surface:
    """Latency over (a, b) measured on a grid of a-values, each with its own curve in b.

    Used for attention (batch x context) and GEMMs ((n, k) pairs x m): the outer axis
    is bracketed, the inner one interpolated by `Curve` on each bracketing row.
    """

    def __init__(self, rows: dict[float, Curve]):
        self.keys = sorted(rows)
        self.rows = [rows[k] for k in self.keys]

    def __call__(self, a: float, b: float) -> float:
        return sum(w * self.rows[i](b) for i, w in bracket(self.keys, a))

    def provenance(self, a: float, b: float) -> str:
        return weakest(
            grid_provenance(self.keys, a), *(self.rows[i].provenance(b) for i, _ in bracket(self.keys, a))
        )

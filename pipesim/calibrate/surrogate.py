"""A least-squares fit of a profile's free parameters in tens of simulations: a surrogate
of each measured point's prediction, refined where the fit looks.

The residual of a measured point is its relative error (0 inside its band,
measured.Point.error) at the simulator's prediction, and a simulation is the cost. The
old fit priced every candidate by simulation: a grid of 8 values per parameter, then
least squares with finite differences, all again for each point left out (1,940
simulations for 2 parameters on 5 points). Here every simulation is kept:

- Coordinates. A parameter's range is wide (cpu_iteration_ms 0-200 ms) and the answer
  sits anywhere in it, so the search runs on t = log(1 + (x - lo) / d) / log(1 + (hi -
  lo) / d), d a thousandth of the range: [0, 1], as fine near the bottom as the old
  grid's geometric steps.
- Surrogate. Each point's log prediction is interpolated over the simulated parameter
  vectors by a thin-plate spline with a linear part (scipy's RBFInterpolator): a cost
  that adds time per step makes log throughput a softplus of t (flat, then linear),
  which it follows from a handful of vectors. The fit's objective on it, the sum of
  squared residuals, costs microseconds, so it is minimised globally (a dense grid,
  then L-BFGS-B from the best few) with a tie-break: among fits equally good to 1e-8,
  the one nearest the start (the profile's own values), as a warm-started least squares
  would end.
- Refinement. Each round simulates, at every point (in parallel, base/pool.py), the
  surrogate's minimum and a Gauss-Newton step from the best vector so far (its slopes
  from the simulated vectors nearest it), the ones not simulated yet. When a round
  gains nothing, a probe around the best vector (one vector per parameter, a forward
  finite difference, its step halved each time) gives the next step its slopes. The
  answer is the best simulated vector, so every reported prediction and error is the
  simulator's own.
- Leave one out. Each point left out is the same loop on the other points' residuals,
  from the same start (not the full fit, which knows the point left out) and on the
  same samples (every vector simulates every point), so it needs few vectors more.

Known cases: a planted pair of parameters is recovered to 1e-4 (tests/test_fit.py); the
reference deployment's two hypotheses in tens to a hundred-odd simulations against the
old fit's 645 and 718, to the same least-squares cost (benchmarks/bench_calibrate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

DESIGN_LEVELS = (0.15, 0.6)  # t of the first vectors: a 2-level factorial around the start
XTOL = 1e-4  # in t: a minimum this close to a simulated vector is that vector
PROBE = 0.02  # in t: the probes' first step, a finite difference's
TIE = 1e-8  # weight of the distance to the start: the tie-break between equal fits
MAX_ROUNDS = 12  # rounds of new vectors per solve at most (each simulates every point)
FTOL = 1e-3  # a new vector that lowers the best cost by less than this share of it gains nothing
DAMPING = 1e-3  # of a Gauss-Newton step (Levenberg: times the diagonal)
EXACT = 1e-6  # a cost this low (every error within 0.1%) is a fit: nothing left to gain
PROBE_MIN = PROBE / 8
GRID = {1: 257, 2: 65, 3: 17}  # candidates per axis of the global search on the surrogate


@dataclass(frozen=True)
class Box:
    """The parameters' bounds (in the fit's units) and the map to t in [0, 1]."""

    lo: np.ndarray
    hi: np.ndarray

    @property
    def d(self) -> np.ndarray:
        return (self.hi - self.lo) * 1e-3

    def to_t(self, x: np.ndarray) -> np.ndarray:
        return np.log1p((np.clip(x, self.lo, self.hi) - self.lo) / self.d) / np.log1p(1e3)

    def to_x(self, t: np.ndarray) -> np.ndarray:
        return self.lo + self.d * np.expm1(np.clip(t, 0, 1) * np.log1p(1e3))


Simulate = Callable[[list[np.ndarray]], np.ndarray]  # vectors (x) -> predictions, one row per vector


class Samples:
    """Every simulated vector (as t) and its predictions at every point (tok/s)."""

    def __init__(self, box: Box, simulate: Simulate, points: int) -> None:
        self.box, self.simulate = box, simulate
        self.t = np.zeros((0, len(box.lo)))
        self.y = np.zeros((0, points))

    def add(self, ts: Sequence[np.ndarray]) -> None:
        """Simulate every point at the vectors not simulated yet."""
        new: list[np.ndarray] = []
        for t in ts:
            t = np.clip(np.asarray(t, dtype=float), 0, 1)
            if self.nearest(t)[1] > XTOL / 10 and all(np.max(np.abs(t - u)) > XTOL / 10 for u in new):
                new.append(t)
        if not new:
            return
        preds = self.simulate([self.box.to_x(t) for t in new])
        self.t = np.vstack([self.t, new])
        self.y = np.vstack([self.y, preds])

    def nearest(self, t: np.ndarray) -> tuple[int, float]:
        """The simulated vector nearest `t` and its distance (max norm); (-1, inf) if none."""
        if not len(self.t):
            return -1, float("inf")
        d = np.max(np.abs(self.t - t), axis=1)
        i = int(np.argmin(d))
        return i, float(d[i])


def errors(pred: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """measured.Point.error over arrays: relative error against the nearer edge of each
    point's band, 0 inside it (last axis: the points)."""
    return np.where(pred < lo, (pred - lo) / lo, np.where(pred > hi, (pred - hi) / hi, 0.0))


class Fit:
    """One solve: minimise the squared residuals of the points `use` (indices) from
    `start` (t), refining the shared samples."""

    def __init__(self, samples: Samples, lo: np.ndarray, hi: np.ndarray, use: np.ndarray) -> None:
        self.s, self.lo, self.hi, self.use = samples, lo, hi, use

    def true_cost(self, i: int, start: np.ndarray) -> float:
        r = errors(self.s.y[i, self.use], self.lo[self.use], self.hi[self.use])
        return float(np.sum(r * r) + TIE * np.sum((self.s.t[i] - start) ** 2))

    def surrogate(self) -> Callable[[np.ndarray], np.ndarray]:
        """t (k x n) -> the surrogate's predictions (k x points used)."""
        from scipy.interpolate import RBFInterpolator

        y = np.log(np.maximum(self.s.y[:, self.use], 1e-12))
        n = self.s.t.shape[1]
        if len(self.s.t) < n + 2:  # too few for a spline with a linear part: the linear part alone
            a = np.column_stack([np.ones(len(self.s.t)), self.s.t])
            coef = np.linalg.lstsq(a, y, rcond=None)[0]
            return lambda t: np.exp(np.column_stack([np.ones(len(t)), t]) @ coef)
        rbf = RBFInterpolator(self.s.t, y, kernel="thin_plate_spline", degree=1)
        return lambda t: np.exp(rbf(t))

    def minimum(self, start: np.ndarray) -> np.ndarray:
        """The surrogate's global minimum (with the tie-break toward `start`)."""
        from scipy.optimize import minimize

        model = self.surrogate()
        lo, hi = self.lo[self.use], self.hi[self.use]

        def cost(t: np.ndarray) -> np.ndarray:
            r = errors(model(t), lo, hi)
            return np.sum(r * r, axis=1) + TIE * np.sum((t - start) ** 2, axis=1)

        n = len(start)
        if n in GRID:
            axes = [np.linspace(0, 1, GRID[n])] * n
            grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, n)
        else:
            from scipy.stats import qmc

            grid = qmc.Sobol(n, seed=0).random(4096)
        cands = np.vstack([grid, self.s.t, start[None, :]])
        values = cost(cands)
        best = cands[np.argsort(values, kind="stable")[:4]]

        def one(t: np.ndarray, *_args: object, **_kw: object) -> float:
            # minimize's stubs take an objective that accepts extra arguments too
            return float(cost(t[None, :])[0])

        found = []
        for t0 in best:
            res = minimize(one, t0, method="L-BFGS-B", bounds=[(0, 1)] * n)
            found.append((float(res.fun), tuple(np.clip(res.x, 0, 1))))
        return np.array(min(found)[1])

    def best(self, start: np.ndarray) -> tuple[int, float]:
        """The best simulated vector and its cost."""
        costs = [self.true_cost(k, start) for k in range(len(self.s.t))]
        k = int(np.argmin(costs))
        return k, costs[k]

    def newton(self, k: int) -> np.ndarray | None:
        """A Gauss-Newton step from simulated vector `k` (t), on the log predictions of
        the points used: their slopes from the n simulated vectors nearest it (after a
        probe, a forward finite difference per parameter), each point aimed at the
        nearer edge of its band (itself inside it), damped a little (Levenberg) and
        kept in the box. None if the nearest vectors do not span every direction."""
        base, n = self.s.t[k], self.s.t.shape[1]
        others = [i for i in np.argsort(np.max(np.abs(self.s.t - base), axis=1), kind="stable") if i != k][:n]
        if len(others) < n:
            return None
        dt = self.s.t[others] - base
        if np.linalg.cond(dt) > 1e6:
            return None
        logy = np.log(np.maximum(self.s.y[:, self.use], 1e-12))
        jac = np.linalg.solve(dt, logy[others] - logy[k]).T  # points x parameters
        y0 = self.s.y[k, self.use]
        want = np.log(np.clip(y0, self.lo[self.use], self.hi[self.use])) - np.log(y0)
        jtj = jac.T @ jac
        d = np.linalg.lstsq(jtj + DAMPING * np.diag(np.diag(jtj)), jac.T @ want, rcond=None)[0]
        return np.clip(base + d, 0, 1)

    def solve(self, start: np.ndarray, max_rounds: int = MAX_ROUNDS) -> int:
        """Rounds of new vectors, each simulated at every point (in parallel): the
        surrogate's minimum and a Gauss-Newton step from the best vector (`newton`), the
        ones not simulated yet. While a round gains (lowers the best cost by more than
        FTOL of it), go on; when it does not, probe around the best vector (one vector
        per parameter at PROBE, halved at each probe that follows no gain: the local
        slopes the next Gauss-Newton step uses). Stop when a vector fits to within
        EXACT, when the probes would be finer than PROBE_MIN, or after `max_rounds`.
        The index of the best vector."""
        step = PROBE
        for _ in range(max_rounds):
            k, cost = self.best(start)
            if cost <= EXACT:
                break
            cands = [self.minimum(start)]
            gn = self.newton(k)
            if gn is not None:
                cands.append(gn)
            cands = [t for t in cands if self.s.nearest(t)[1] > XTOL]
            if cands:
                self.s.add(cands)
                if cost - self.best(start)[1] > FTOL * cost:
                    continue
            if step < PROBE_MIN:
                break
            base = self.s.t[self.best(start)[0]]
            self.s.add(
                [
                    np.where(base[j] + step <= 1, base + step * e, base - step * e)
                    for j, e in enumerate(np.eye(len(base)))
                ]
            )
            step /= 2
        return self.best(start)[0]


def design(start: np.ndarray) -> list[np.ndarray]:
    """The first vectors: the start and a 2-level factorial (DESIGN_LEVELS) for up to 3
    parameters; beyond, the start moved to each level along one axis at a time."""
    n = len(start)
    if n <= 3:
        grid = np.stack(np.meshgrid(*[DESIGN_LEVELS] * n, indexing="ij"), -1).reshape(-1, n)
        return [start, *grid]
    out = [start]
    for j in range(n):
        for level in DESIGN_LEVELS:
            t = start.copy()
            t[j] = level
            out.append(t)
    return out

"""Fitting the host loop's open parameters to the public corpus, leave one publisher out.

docs/host-loop.md §6.3 marks some host-loop defaults as guesses (input preparation, the
output path per token where it was not timed, V1's broadcast to its TP workers) and
measured others only in part (the front end per request: tokenisation and the hand-over,
not the HTTP server around them). This module fits chosen profile parameters
(`profiles.profile.FITTABLE`) by code to the measured numbers of the public corpus
(validation/), each run predicted as `pipesim validate --corpus` predicts it by the user
path (pipesim.calibrate.corpus_scenario: the catalogue's profile for the box, the run's
engine release and flags), and reports the error on publishers the fit did not see.

- Data: every corpus run the check expresses; its compared numbers (crosscheck's rows:
  output and total tok/s, requests/s, TTFT, TPOT, end-to-end latency) in the band's
  residual groups (throughput, ttft, tpot: report.residual_band.RESIDUAL_GROUP).
- Loss: the mean over (run, group) of |log(measured / predicted)|, a (run, group)'s
  residual the mean of its numbers' (a run weighs once per group, as in the band's fit).
- A knob is a parameter for every engine (`name`) or one engine's (`engine:name`), set
  on the run's profile after the host loop's defaults (`Profile.with_params`).
- Search: `grid_fit`, every combination of each knob's values on a stated grid
  within its bounds (KNOBS: a physical range, not the optimiser's), the one of least
  loss kept; or `fit`, coordinate descent over a multiplicative grid, the factors
  narrowing sweep by sweep. The simulated response is not smooth, so no gradient is
  taken.
- Leave one publisher out (residuals.publisher): per publisher, the knobs fitted on the
  others' runs, its runs predicted with them. Every (run, knob values) is simulated once
  and cached, so the folds share their simulations: on a grid, a run is simulated once
  per value of its own engine's knobs, and every fold's search is then free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ..report.residual_band import RESIDUAL_GROUP
from .residuals import publisher

# knob -> (start, lower, upper): the physical range a fit may move it in (start: the
# default where the host loop's defaults set one, else the knob's neutral value)
KNOBS: dict[str, tuple[float, float, float]] = {
    "kernel_scale": (1.0, 0.5, 4.0),
    "frontend_ms": (0.24, 0.05, 20.0),
    "prep_per_req_us": (1.0, 0.1, 200.0),
    "prep_base_us": (100.0, 10.0, 5000.0),
    "stream_token_us": (9.9, 1.0, 500.0),
    "tp_bcast_per_rank_us": (1.0, 1.0, 2000.0),
    "host_cpu_factor": (1.68, 0.5, 20.0),
}
SWEEP_FACTORS = ((0.5, 2.0), (0.7, 1.4))


def knob_name(key: str) -> tuple[str, str]:
    """('engine' or '', parameter) of a knob key ('vllm:frontend_ms', 'kernel_scale')."""
    engine, _, name = key.rpartition(":")
    return engine, name


def values_for(theta: dict[str, float], engine: str) -> dict[str, float]:
    """The parameter values a run of `engine` takes from `theta` (its engine's knobs and
    every engine's)."""
    out = {}
    for key, v in theta.items():
        e, name = knob_name(key)
        if e in ("", engine):
            out[name] = float(v)
    return out


def _simulate(item: tuple) -> list[dict]:
    """One corpus run by the user path with `values` set on its profile: crosscheck's
    compared rows ([] when the run cannot be expressed)."""
    from ..api import run as simulate
    from .corpus_scenario import Skip, scenario_for
    from .crosscheck import _rows

    part, values = item
    first = part.iloc[0].to_dict()
    try:
        sc = scenario_for(first, dict(zip(part.metric, part.value)), "user")
    except Skip:
        return []
    if values:
        sc = replace(sc, profile=sc.profile.with_params(**values))
    return _rows(part, sc, simulate(sc), "user")


@dataclass
class Evaluator:
    """The corpus's runs and every simulation made of them, by knob values."""

    corpus: pd.DataFrame
    jobs: int = 1
    cache: dict = field(default_factory=dict)  # (run_id, values) -> rows
    on_batch: Callable[[int], object] | None = None  # told how many simulations a batch runs

    def __post_init__(self) -> None:
        self.parts: dict[str, pd.DataFrame] = {}
        for rid, part in self.corpus.groupby("run_id", sort=True):
            assert isinstance(rid, str)  # a corpus's run_id is text (corpus.py reads it so)
            self.parts[rid] = part
        self.engine = {rid: part.engine.iloc[0] for rid, part in self.parts.items()}
        self.source = {rid: part.source_id.iloc[0] for rid, part in self.parts.items()}

    def _key(self, rid: str, theta: dict) -> tuple:
        return rid, tuple(sorted(values_for(theta, self.engine[rid]).items()))

    def rows(self, thetas: list[dict], runs: Iterable[str]) -> list[pd.DataFrame]:
        """The compared rows of `runs` at each of `thetas`, simulating what is not cached
        (all of it in one batch, over `jobs` processes)."""
        runs = list(runs)
        todo = {}
        for theta in thetas:
            for rid in runs:
                key = self._key(rid, theta)
                if key not in self.cache and key not in todo:
                    todo[key] = (self.parts[rid], dict(key[1]))
        if todo:
            if self.on_batch:
                self.on_batch(len(todo))
            items = list(todo.values())
            if self.jobs > 1:
                from concurrent.futures import ProcessPoolExecutor

                with ProcessPoolExecutor(self.jobs) as pool:
                    got = list(pool.map(_simulate, items, chunksize=1))
            else:
                got = [_simulate(i) for i in items]
            self.cache.update(zip(todo, got))
        return [
            pd.DataFrame([r for rid in runs for r in self.cache[self._key(rid, theta)]]) for theta in thetas
        ]

    def expressed(self) -> list[str]:
        """The runs the check expresses (simulated at the defaults to find out)."""
        (df,) = self.rows([{}], self.parts)
        return sorted(df.run_id.unique())


def residuals(df: pd.DataFrame) -> pd.DataFrame:
    """Per (run, group): the mean signed log(measured / predicted) of its numbers (for
    TPOT-like figures of the inverse sense, as the band's groups read them)."""
    if df.empty:
        return pd.DataFrame(columns=["run_id", "source_id", "group", "log_residual"])
    group = [RESIDUAL_GROUP[f][0] for f in df.family]
    sign = np.array([RESIDUAL_GROUP[f][1] for f in df.family], dtype=float)
    ok = (df.predicted > 0) & (df.measured > 0)
    log_r = np.where(
        ok, sign * np.log(df.measured.clip(lower=1e-12) / df.predicted.clip(lower=1e-12)), np.nan
    )
    r = df.assign(group=group, log_residual=log_r).dropna(subset=["log_residual"])
    return r.groupby(["run_id", "source_id", "group"], as_index=False).log_residual.mean()


def loss(df: pd.DataFrame) -> float:
    """Mean |log residual| over (run, group)."""
    r = residuals(df)
    return float(r.log_residual.abs().mean()) if len(r) else math.inf


@dataclass(frozen=True)
class Fit:
    """Knob values fitted on some runs, and the loss they reach there."""

    theta: dict
    loss: float
    start_loss: float
    evaluations: int  # knob settings tried
    runs: tuple


def candidates(key: str, value: float, factors: tuple) -> list[float]:
    _, name = knob_name(key)
    _, lo, hi = KNOBS[name]
    return sorted({min(hi, max(lo, value * f)) for f in factors} - {value})


def fit(ev: Evaluator, start: dict, runs: Iterable[str], sweeps: tuple = SWEEP_FACTORS) -> Fit:
    """Coordinate descent of the knobs of `start` (key -> starting value) on `runs`: each
    knob in turn moves to the best of its candidates (its value times the sweep's
    factors, within its bounds) if that lowers the loss; a sweep's factors are used until
    a pass moves nothing, then the next, finer ones."""
    runs = tuple(runs)
    theta = dict(start)
    (df,) = ev.rows([theta], runs)
    best = start_loss = loss(df)
    tried = 1
    for factors in sweeps:
        moved = True
        while moved:
            moved = False
            for key in start:
                thetas = [{**theta, key: c} for c in candidates(key, theta[key], factors)]
                if not thetas:
                    continue
                tried += len(thetas)
                losses = [loss(d) for d in ev.rows(thetas, runs)]
                i = int(np.argmin(losses))
                if losses[i] < best - 1e-4:
                    best, theta, moved = losses[i], thetas[i], True
    return Fit(theta, best, start_loss, tried, runs)


def grid_fit(ev: Evaluator, grid: dict, runs: Iterable[str]) -> Fit:
    """The combination of knob values (key -> its grid) of least loss on `runs`; the
    first key's first value ... (`grid`'s order) is the start the loss is reported from.
    Values outside a knob's bounds are refused."""
    import itertools

    runs = tuple(runs)
    for key, values in grid.items():
        _, lo, hi = KNOBS[knob_name(key)[1]]
        if not values or any(not lo <= v <= hi for v in values):
            raise ValueError(f"grid of {key}: {values} outside its bounds {lo}-{hi}")
    keys = list(grid)
    thetas = [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]
    losses = [loss(d) for d in ev.rows(thetas, runs)]
    i = int(np.argmin(losses))
    return Fit(thetas[i], losses[i], losses[0], len(thetas), runs)


@dataclass(frozen=True)
class Fold:
    """One publisher held out: the fit on the others, and its runs' rows at the defaults
    and at the fitted values."""

    held_out: str
    fit: Fit
    before: pd.DataFrame
    after: pd.DataFrame


def lopo(
    ev: Evaluator, start: dict, runs: list[str] | None = None, search: Callable = fit
) -> tuple[Fit, list[Fold]]:
    """The fit on every run, and one fold per publisher (fitted without it); `search` is
    `fit` (start: key -> starting value) or `grid_fit` (start: key -> its grid)."""
    runs = runs if runs is not None else ev.expressed()
    pubs = {rid: publisher(ev.source[rid]) for rid in runs}
    whole = search(ev, start, runs)
    folds = []
    for pub in sorted(set(pubs.values())):
        held = [r for r in runs if pubs[r] == pub]
        f = search(ev, start, [r for r in runs if pubs[r] != pub])
        before, after = ev.rows([{}, f.theta], held)
        folds.append(Fold(pub, f, before, after))
    return whole, folds

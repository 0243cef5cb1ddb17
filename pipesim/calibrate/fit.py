"""Fitting a profile's free parameters to measured end-to-end points.

The tables pin kernel and collective costs; what they cannot pin (CPU time per
iteration, CPU launch time without CUDA graphs, how far a box's TP path is from its
measured NCCL table, a kernel-efficiency factor) is fitted here by bounded least
squares over the relative errors of the measured points, each predicted by the full
simulation, in tens of simulations: a surrogate of each point's prediction refined
where the fit looks, every simulation kept and shared by the fit and its leave-one-out
solves (surrogate.py), the simulations of a round spread over local processes (base/
pool.py). Leave-one-out errors (fit on all points but one, predict that one) show
whether a profile predicts or merely memorises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..base.errors import require
from ..profiles.measured import Point
from ..profiles.profile import FITTABLE, Profile
from .surrogate import MAX_ROUNDS, Box, Fit, Samples, design

if TYPE_CHECKING:
    from ..scenario.build import Scenario

if TYPE_CHECKING:
    from ..scenario.build import Scenario
    from ..scenario.work import Work


def point_scenario(profile: Profile, point: Point) -> Scenario:
    """The measured run as a scenario (its engine knobs as measured)."""
    from ..scenario.build import build_scenario

    return build_scenario(
        tp=point.tp,
        pp=point.pp,
        concurrency=point.conc,
        profile=profile,
        model=point.model,
        engine=point.engine,
        input_len=str(point.input_len),
        output_len=str(point.output_len),
        **dict(point.knobs),
    )


def predict_point(profile: Profile, point: Point) -> float:
    """The point's metric (tok/s) as the simulator predicts it for the measured run
    (a deterministic run: C warm-up requests, then max(2C, 4) measured)."""
    from ..api import run

    r = run(
        point_scenario(profile, point),
        warmup_requests=point.conc,
        measure_requests=max(2 * point.conc, 4),
        ci_target=None,
    )
    return r.output_throughput_tok_s if point.metric == "output_tok_s" else r.per_request_tok_s


def runs_per_solve(params: int) -> int:
    """Evaluations of the points one fit makes at most with one solve (surrogate.py: its
    first vectors, then MAX_ROUNDS rounds of one vector and a probe per parameter): an
    upper bound for the work bound."""
    return len(design(np.zeros(params))) + MAX_ROUNDS * (1 + params)


def points_work(profile: Profile, points: Sequence[Point], what: str, hint: str) -> tuple[Work, list]:
    """An empty Work of a command over `points` (the bound of a sweep: it runs many
    scenarios by design) and each point's scenario, for the command to add its runs."""
    from ..base.checks import MAX_SWEEP_BATCH_STEPS
    from ..scenario.work import Work

    return Work(what, hint, MAX_SWEEP_BATCH_STEPS), [point_scenario(profile, p) for p in points]


@dataclass(frozen=True)
class FitResult:
    params: dict  # fitted values
    points: tuple  # the measured points
    predicted: tuple  # tok/s with the fitted values
    errors: tuple  # relative error per point (0 inside a band)
    loo_errors: tuple  # leave-one-out relative error per point (None if not computed)
    evaluations: int

    @property
    def mape(self) -> float:
        return float(np.mean(np.abs(self.errors))) * 100

    def loo_error_pct(self) -> dict:
        """Point label -> leave-one-out error in %, as profile.toml [fit] stores it
        (pipesim.report.uncertainty reads it for prediction intervals)."""
        return {p.label(): round(e * 100, 3) for p, e in zip(self.points, self.loo_errors) if e is not None}

    @property
    def loo_mape(self) -> float:
        vals = [e for e in self.loo_errors if e is not None]
        return float(np.mean(np.abs(vals))) * 100 if vals else float("nan")

    def report(self) -> str:
        """A Markdown fit report: parameters, residuals per point, leave-one-out."""
        lines = ["| parameter | fitted value |", "|---|---|"]
        lines += [f"| {k} | {v:.6g} |" for k, v in self.params.items()]
        lines += [
            "",
            "| point | measured tok/s | predicted | error | leave-one-out |",
            "|---|---|---|---|---|",
        ]
        for p, pred, e, loo_e in zip(self.points, self.predicted, self.errors, self.loo_errors):
            meas = f"{p.lo:g}" if p.lo == p.hi else f"{p.lo:g}-{p.hi:g}"
            loo = "-" if loo_e is None else f"{loo_e * 100:+.1f}%"
            lines.append(f"| {p.label()} | {meas} | {pred:.1f} | {e * 100:+.1f}% | {loo} |")
        lines += [
            "",
            f"MAPE {self.mape:.1f}%, leave-one-out MAPE {self.loo_mape:.1f}% "
            f"({self.evaluations} simulations)",
        ]
        return "\n".join(lines)


def _predict_task(
    shared: tuple[Profile, tuple[str, ...], tuple[Point, ...]], task: tuple[tuple, int]
) -> float:
    """One simulation of a fit (a worker's task): point k at parameter values x."""
    profile, names, points = shared
    x, k = task
    return predict_point(profile.with_params(**dict(zip(names, x))), points[k])


def max_simulations(names: Sequence[str], points: Sequence[Point], loo: bool) -> int:
    """The most simulations a fit may run: its first vectors, then every solve's rounds
    (the fit's, and one per point left out), each vector at every point."""
    solves = 1 + (len(points) if loo and len(points) > 1 else 0)
    return len(points) * (runs_per_solve(len(names)) + (solves - 1) * MAX_ROUNDS * (1 + len(names)))


def fit(
    profile: Profile,
    names: list[str],
    points: list[Point] | None = None,
    loo: bool = True,
    on_simulation: Callable[[int, int], object] | None = None,
    jobs: int = 1,
) -> FitResult:
    """Fit `names` (see FITTABLE) to the profile's measured points (or `points`), with
    leave-one-out errors unless `loo=False`. The simulations of each round run on `jobs`
    local processes (the same fit as one: every run is deterministic), counted in a
    sweep's work bound at their most before the first starts. `on_simulation(done,
    expected)` after each one, `expected` the simulations the fit expects in all (it
    grows if the fit needs more), for a progress bar with an ETA from the first."""
    from ..base.pool import map_shared

    points = list(points if points is not None else profile.measured)
    require(
        points,
        f"profile {profile.name} has no measured points to fit (import some: pipesim calibrate import bench)",
    )
    unknown = [n for n in names if n not in FITTABLE]
    require(not unknown, f"cannot fit {', '.join(unknown)}; fittable: {', '.join(FITTABLE)}")
    require(names, "name at least one parameter to fit")
    most = max_simulations(names, points, loo)
    work, scenarios = points_work(
        profile,
        points,
        f"fitting {len(names)} parameter(s)",
        "fit fewer points, or leave out the leave-one-out errors",
    )
    work.add("the fit's simulations, at most", scenarios, most // len(points)).check()
    box = Box(np.array([FITTABLE[n][0] for n in names]), np.array([FITTABLE[n][1] for n in names]))
    n, npts = len(names), len(points)
    solves = 1 + (npts if loo and npts > 1 else 0)
    done = [0, 0]  # simulations done, solves finished

    def expected() -> int:
        # a solve usually takes a few vectors and a probe; a point left out fewer
        left = (4 + n if done[1] == 0 else 0) + (solves - max(done[1], 1)) * (2 + n)
        return done[0] + npts * left

    def one_done(_: int) -> None:
        done[0] += 1
        if on_simulation:
            on_simulation(done[0], max(expected(), done[0]))

    shared = (profile, tuple(names), tuple(points))

    def simulate(xs: list[np.ndarray]) -> np.ndarray:
        tasks = [(tuple(float(v) for v in x), k) for x in xs for k in range(npts)]
        return np.array(map_shared(_predict_task, shared, tasks, jobs, one_done)).reshape(len(xs), npts)

    samples = Samples(box, simulate, npts)
    start = box.to_t(np.array([float(getattr(profile.params, name)) for name in names]))
    samples.add(design(start))
    lo, hi = np.array([p.lo for p in points]), np.array([p.hi for p in points])
    best = Fit(samples, lo, hi, np.arange(npts)).solve(start)
    done[1] = 1
    predicted = samples.y[best]
    loo_errors: list = [None] * npts
    if solves > 1:
        for i in range(npts):
            use = np.array([k for k in range(npts) if k != i])
            # from the profile's own values, as the fit: a start (and tie-break) at the
            # full fit would hand an underdetermined solve the point it left out
            b = Fit(samples, lo, hi, use).solve(start)
            loo_errors[i] = points[i].error(float(samples.y[b, i]))
            done[1] += 1
    values = {name: float(v) for name, v in zip(names, box.to_x(samples.t[best]))}
    errors = [p.error(float(v)) for p, v in zip(points, predicted)]
    return FitResult(
        values,
        tuple(points),
        tuple(float(v) for v in predicted),
        tuple(errors),
        tuple(loo_errors),
        int(samples.y.size),
    )


def fit_profile(
    profile_dir: str | Path,
    names: list[str],
    out: str | Path | None = None,
    loo: bool = True,
    on_simulation: Callable[[int, int], object] | None = None,
    jobs: int = 1,
) -> FitResult:
    """Fit `names` to a profile's measured points (`fit`: on `jobs` processes,
    `on_simulation` its progress) and write the profile again (in place unless `out`)
    with the fitted values, their sources, a summary and fit_report.md."""
    from ..profiles.profile import load_profile
    from ..profiles.writing import check_profile_out, rewrite_profile

    check_profile_out(profile_dir if out is None else out)
    prof = load_profile(profile_dir)
    result = fit(prof, names, loo=loo, on_simulation=on_simulation, jobs=jobs)
    params = {**prof.meta.get("params", {}), **result.params}
    sources = {
        **prof.meta.get("param_sources", {}),
        **{k: "fitted to measured.csv by pipesim calibrate fit; see fit_report.md" for k in result.params},
    }
    summary = {
        "params": ", ".join(f"{k}={v:.4g}" for k, v in result.params.items()),
        "mape_pct": round(result.mape, 2),
        "loo_mape_pct": round(result.loo_mape, 2),
        "report": "fit_report.md",
        **({"loo_error_pct": result.loo_error_pct()} if result.loo_error_pct() else {}),
    }
    rewrite_profile(
        profile_dir,
        out,
        meta_update={"params": params, "param_sources": sources, "fit": summary},
        extra={"fit_report.md": f"# Fit of {prof.name}\n\n{result.report()}\n"},
    )
    return result

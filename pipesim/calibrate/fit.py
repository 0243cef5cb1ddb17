"""Fitting a profile's free parameters to measured end-to-end points.

The tables pin kernel and collective costs; what they cannot pin (CPU time per
iteration, CPU launch time without CUDA graphs, how far a box's TP path is from its
measured NCCL table, a kernel-efficiency factor) is fitted here by bounded least
squares over the relative errors of the measured points, each predicted by the full
simulation. Leave-one-out errors (fit on all points but one, predict that one) show
whether a profile predicts or merely memorises.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import least_squares

from ..base.errors import require
from ..profiles.measured import Point
from ..profiles.profile import FITTABLE, Profile

if TYPE_CHECKING:
    from ..scenario.build import Scenario
    from ..scenario.work import Work


def point_scenario(profile: Profile, point: Point) -> Scenario:
    """The measured run of `point` as a scenario of `profile`."""
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


# a least-squares solve (_solve): a coarse grid of GRID_POINTS values a parameter (with
# one or two parameters), then at most MAX_NFEV evaluations, each with a 2-point Jacobian
# of one more per parameter; each evaluation predicts every point once
GRID_POINTS = 8
MAX_NFEV = 60


def runs_per_solve(params: int) -> int:
    """Evaluations of the points a solve makes at most (an upper bound for the work bound)."""
    return (GRID_POINTS**params if params <= 2 else 0) + MAX_NFEV * (1 + params)


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


class _Objective:
    def __init__(self, profile: Profile, names: list[str], points: list[Point]):
        self.profile, self.names, self.points = profile, names, points
        self.units = np.array([FITTABLE[n][2] for n in names])
        self.evaluations = 0

    def profile_at(self, u: np.ndarray) -> Profile:
        return self.profile.with_params(
            **{n: float(v) for n, v in zip(self.names, np.asarray(u) * self.units)}
        )

    def predictions(self, u: np.ndarray) -> list[float]:
        self.evaluations += len(self.points)
        prof = self.profile_at(u)
        return [predict_point(prof, p) for p in self.points]

    def __call__(self, u: np.ndarray) -> np.ndarray:
        return np.array([p.error(v) for p, v in zip(self.points, self.predictions(u))])


def _solve(obj: _Objective, start: np.ndarray) -> np.ndarray:
    lo = np.array([FITTABLE[n][0] for n in obj.names]) / obj.units
    hi = np.array([FITTABLE[n][1] for n in obj.names]) / obj.units
    x0 = np.clip(np.asarray(start, dtype=float), lo, hi)
    if len(obj.names) <= 2:
        # the simulated response is not smooth everywhere: start from the best point
        # of a coarse grid over each parameter's range
        axes = [
            np.unique(
                np.clip(
                    np.concatenate(([x], lo_ + (hi_ - lo_) * np.geomspace(1e-3, 1, GRID_POINTS - 1))),
                    lo_,
                    hi_,
                )
            )
            for x, lo_, hi_ in zip(x0, lo, hi)
        ]
        x0 = min((np.array(c) for c in itertools.product(*axes)), key=lambda c: float(np.sum(obj(c) ** 2)))
    # diff_step is array_like (scipy's documentation): a scalar is the same step for every
    # parameter, which scipy-stubs' narrower annotation (arrays, sequences) leaves out
    sol = least_squares(
        obj,
        x0,
        bounds=(lo, hi),
        diff_step=1e-2,  # type: ignore[arg-type]
        xtol=1e-4,
        ftol=1e-4,
        max_nfev=MAX_NFEV,
    )
    return sol.x


def solves(points: Sequence[Point], loo: bool) -> int:
    """Least-squares solves a fit runs: the fit, and one per point left out."""
    return 1 + (len(points) if loo and len(points) > 1 else 0)


def fit(
    profile: Profile,
    names: list[str],
    points: list[Point] | None = None,
    loo: bool = True,
    on_solve: Callable[[], object] | None = None,
) -> FitResult:
    """Fit `names` (see FITTABLE) to the profile's measured points (or `points`).
    `on_solve` is called after each least-squares solve: 1 for the fit, then one per
    point left out (`solves(points, loo)` in all), for a progress bar."""
    points = list(points if points is not None else profile.measured)
    require(
        points,
        f"profile {profile.name} has no measured points to fit (import some: pipesim calibrate import bench)",
    )
    unknown = [n for n in names if n not in FITTABLE]
    require(not unknown, f"cannot fit {', '.join(unknown)}; fittable: {', '.join(FITTABLE)}")
    require(names, "name at least one parameter to fit")
    n = solves(points, loo)
    work, scenarios = points_work(
        profile,
        points,
        f"fitting {len(names)} parameter(s)",
        "fit fewer points, or leave out the leave-one-out errors",
    )
    work.add("the solves' evaluations", scenarios, n * runs_per_solve(len(names))).add(
        "the results", scenarios, n
    )
    work.check()
    obj = _Objective(profile, names, points)
    start = np.array([getattr(profile.params, n) for n in names]) / obj.units
    x = _solve(obj, start)
    if on_solve:
        on_solve()
    predicted = obj.predictions(x)
    errors = [p.error(v) for p, v in zip(points, predicted)]
    loo_errors: list = [None] * len(points)
    if loo and len(points) > 1:
        for i in range(len(points)):
            rest = points[:i] + points[i + 1 :]
            sub = _Objective(profile, names, rest)
            xi = _solve(sub, x)
            obj.evaluations += sub.evaluations
            if on_solve:
                on_solve()
            loo_errors[i] = points[i].error(predict_point(obj.profile_at(xi), points[i]))
    values = {n: float(v) for n, v in zip(names, x * obj.units)}
    return FitResult(
        values, tuple(points), tuple(predicted), tuple(errors), tuple(loo_errors), obj.evaluations
    )


def fit_profile(
    profile_dir: str | Path,
    names: list[str],
    out: str | Path | None = None,
    loo: bool = True,
    on_solve: Callable[[], object] | None = None,
) -> FitResult:
    """Fit `names` to a profile's measured points and write the profile again (in
    place unless `out`) with the fitted values, their sources, a summary and
    fit_report.md."""
    from ..profiles.profile import load_profile
    from ..profiles.writing import check_profile_out, rewrite_profile

    check_profile_out(profile_dir if out is None else out)
    prof = load_profile(profile_dir)
    result = fit(prof, names, loo=loo, on_solve=on_solve)
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

"""Diagnosis: where a box loses time, against what its own tables say.

For each measured point, the prediction from the box's measured tables alone (all
free parameters neutral) is compared with the measurement. The gap is then charged,
one hypothesis at a time, to a single component: how much would each all-reduce, each
scheduler iteration, each eager layer launch or every kernel have to cost to explain
it, against what the tables say it costs? Last, each hypothesis is fitted to all the
points at once: one that explains a point but not the others is ruled out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scipy.optimize import brentq

from ..costs.primitives import ACT_BYTES
from ..costs.stage import CostModel
from ..inputs.box import load_box
from ..inputs.model import load_model
from ..inputs.plan import make_plan
from ..profiles.measured import Point
from ..profiles.profile import FITTABLE, Profile, load_profile
from .fit import fit, points_work, predict_point, runs_per_solve

NEUTRAL = {
    "cpu_iteration_ms": 0.0,
    "cpu_hop_ms": 0.0,
    "allreduce_scale": 1.0,
    "allreduce_offset_us": 0.0,
    "eager_launch_us_per_layer": 0.0,
    "kernel_scale": 1.0,
    "host_cpu_factor": 0.0,  # the tables alone: no host loop (costs/host.py; every term scales by it)
}
HYPOTHESES = {
    "allreduce_offset_us": "each TP all-reduce costs more (a slow TP path)",
    "cpu_iteration_ms": "the scheduler CPU takes longer per iteration",
    "eager_launch_us_per_layer": "the CPU launches kernels one by one (no CUDA graphs)",
    "kernel_scale": "every kernel runs slower than the tables",
    "cpu_hop_ms": "each PP hop costs CPU time (metadata pickling)",
}


@dataclass(frozen=True)
class PointDiagnosis:
    point: Point
    tables_only: float  # tok/s from the tables alone
    needed: dict  # hypothesis -> value that explains this point alone (None: cannot)
    allreduce_table_us: float  # one all-reduce at this point's decode batch, from the table (0: no TP)
    allreduces_per_step: int


@dataclass(frozen=True)
class Diagnosis:
    profile: str
    points: tuple  # PointDiagnosis
    consistency: dict  # hypothesis -> (fitted value, MAPE % over all points)

    def to_dict(self) -> dict:
        """What `text` says, as data (`pipesim diagnose --json`)."""
        return {
            "profile": self.profile,
            "points": [
                {
                    "point": d.point.label(),
                    "metric": d.point.metric,
                    "measured_lo": d.point.lo,
                    "measured_hi": d.point.hi,
                    "tables_only": d.tables_only,
                    "needed_alone": dict(d.needed),  # hypothesis -> value (None: cannot explain it alone)
                    "allreduce_table_us": d.allreduce_table_us,
                    "allreduces_per_step": d.allreduces_per_step,
                }
                for d in self.points
            ],
            "consistency": {h: {"value": v[0], "mape_pct": v[1]} for h, v in self.consistency.items()},
        }

    def text(self) -> str:
        out = [f"diagnosis of {self.profile}: measured points against the box's own tables"]
        for d in self.points:
            p = d.point
            gap = (p.value - d.tables_only) / d.tables_only * 100
            out.append(
                f"\n{p.label()} ({p.metric}): measured {p.lo:g}{'' if p.lo == p.hi else f'-{p.hi:g}'} tok/s, "
                f"tables alone predict {d.tables_only:.1f} tok/s ({gap:+.0f}%)"
            )
            if p.lo <= d.tables_only <= p.hi:
                out.append("  the tables explain it: nothing to charge")
                continue
            for h, v in d.needed.items():
                if v is None:
                    out.append(f"  {h:27s} cannot explain it alone")
                elif h == "allreduce_offset_us" and d.allreduce_table_us:
                    per = d.allreduce_table_us + v
                    out.append(
                        f"  all-reduce                  would have to cost {per:,.0f} us each "
                        f"({d.allreduces_per_step} per step), against {d.allreduce_table_us:.0f} us in the "
                        f"box's measured NCCL table: {per / d.allreduce_table_us:.1f}x"
                    )
                elif h == "cpu_iteration_ms":
                    out.append(
                        f"  scheduler CPU               would have to take {v:.2f} ms per iteration (tables: 0)"
                    )
                elif h == "eager_launch_us_per_layer":
                    out.append(f"  eager kernel launch         would have to take {v:,.0f} us per layer")
                elif h == "kernel_scale":
                    out.append(
                        f"  kernels                     would have to run {v:.2f}x slower than the tables"
                    )
                elif h == "cpu_hop_ms":
                    out.append(f"  PP hop CPU                  would have to take {v:.2f} ms per hop")
        out.append("\none cause for all points? each hypothesis fitted to every point at once:")
        for h, (v, m) in sorted(self.consistency.items(), key=lambda kv: kv[1][1]):
            verdict = "explains them" if m <= 10 else "ruled out"
            out.append(f"  {HYPOTHESES[h]:55s} {h} = {v:,.4g}: MAPE {m:.1f}%  -> {verdict}")
        return "\n".join(out)


BRENTQ_MAXITER = 40


def _relevant(p: Point) -> list[str]:
    eager = dict(p.knobs).get("disable_cuda_graph", False)
    hs = ["kernel_scale", "cpu_iteration_ms"]
    if p.tp > 1:
        hs.insert(0, "allreduce_offset_us")
    if eager:
        hs.append("eager_launch_us_per_layer")
    if p.pp > 1:
        hs.append("cpu_hop_ms")
    return hs


def _solve_alone(base: Profile, p: Point, h: str) -> float | None:
    """The value of `h` alone that makes the point's prediction meet its measurement."""
    lo, hi, _ = FITTABLE[h]
    target = p.value
    f = lambda v: predict_point(base.with_params(**{h: v}), p) - target  # noqa: E731
    start = NEUTRAL[h]
    f0, f1 = f(start), f(hi)
    if f0 * f1 > 0:
        return None
    return brentq(f, start, hi, xtol=max(1e-3 * abs(hi - start), 1e-9), rtol=1e-3, maxiter=BRENTQ_MAXITER)


def _hypotheses(profile: Profile) -> list[str]:
    return sorted({h for p in profile.measured for h in _relevant(p)})


def steps(profile: Profile) -> int:
    """Units of work `diagnose` reports to `on_point`: each point, then each hypothesis fit."""
    return len(profile.measured) + len(_hypotheses(profile))


def diagnose(profile: str | Path | Profile, on_point: Callable[[], object] | None = None) -> Diagnosis:
    """Each measured point of a profile (a name, a directory or a loaded one) against
    its tables alone, the gap charged to each hypothesis, and each fitted to all points.
    `on_point()` after each point and each hypothesis fit (progress: `steps`)."""
    if not isinstance(profile, Profile):
        profile = load_profile(profile)
    base = profile.with_params(**NEUTRAL)
    work, scenarios = points_work(
        base, profile.measured, "diagnose", "diagnose fewer measured points at a time"
    )
    work.add("the tables alone", scenarios)
    for p, sc in zip(profile.measured, scenarios):  # a root search per hypothesis: 2 ends + its iterations
        work.add("each hypothesis alone", sc, len(_relevant(p)) * (2 + BRENTQ_MAXITER))
    work.add("each hypothesis fitted", scenarios, len(_hypotheses(profile)) * (runs_per_solve(1) + 1))
    work.check()
    diags = []
    for p in profile.measured:
        tables_only = predict_point(base, p)
        needed = {} if p.lo <= tables_only <= p.hi else {h: _solve_alone(base, p, h) for h in _relevant(p)}
        ar_us, n_ar = 0.0, 0
        if p.tp > 1:
            model = load_model(p.model)
            plan = make_plan(p.tp, p.pp, model.num_layers, p.tp * p.pp, "sglang")
            cm = CostModel(load_box(profile.box), model, plan, base)
            batch = max(1, p.conc // p.pp)
            ar_us = cm.collective("all_reduce", plan.stage_gpus(0), batch * model.hidden * ACT_BYTES)[0] * 1e6
            n_ar = 2 * model.num_layers + 1
        diags.append(PointDiagnosis(p, tables_only, needed, ar_us, n_ar))
        if on_point:
            on_point()
    consistency = {}
    for h in _hypotheses(profile):
        r = fit(base, [h], loo=False)
        consistency[h] = (r.params[h], r.mape)
        if on_point:
            on_point()
    return Diagnosis(profile.name, tuple(diags), consistency)


__all__ = ["diagnose", "Diagnosis"]

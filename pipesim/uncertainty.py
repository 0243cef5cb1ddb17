"""Prediction intervals: how far to trust a headline number (docs/uncertainty.md).

A prediction is wrong for three independent reasons, each turned into a relative
half-width of a "likely" band (about 80% coverage, a 1.28-sigma band):

(a) calibration: the profile predicts points it was not fitted to only as well as
    its leave-one-out errors say; the 80% quantile of |LOO error| over the measured
    points of the scenario's regime (C = 1 or batched, PP or TP only), where at least
    MIN_POINTS exist; otherwise DEFAULT_CALIBRATION_REL, said so in the basis;
(b) workload: what the user did not pin (a fixed length stands for lengths that vary,
    the seed for arrival order, a front-end cost if the profile has one): the spread
    of a small ensemble of short runs (ENSEMBLE_RUNS);
(c) simulation: the run's own 95% confidence half-width, rescaled to 80%.

They are combined in quadrature, rel = sqrt(a^2 + b^2 + c^2), and the band is
multiplicative, [v / (1 + rel), v * (1 + rel)], so it stays positive however wide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

# metrics that get a band (the table's headline numbers)
HEADLINE = (
    "output_throughput_tok_s",
    "per_request_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
)
LIKELY_COVERAGE = 0.80
Z_LIKELY = 1.2816  # two-sided 80% normal quantile
Z_CI = 1.96  # the run's CI is a 95% half-width
MIN_POINTS = 5  # fewer measured points than this in a regime: too few for a quantile
# Stated, not fitted: Vidur (Agrawal et al., MLSys 2024) reports under 9% error on the
# hardware it profiled; off the measured points errors grow. 25% is about three times
# that, the conservative end used where a profile has too few points to speak for itself.
DEFAULT_CALIBRATION_REL = 0.25
ENSEMBLE_RUNS = 4  # short runs: seeds 1..4, lengths spread, front-end cost +-50%
LENGTH_SPREAD = 0.5  # a fixed length N stands for uniform [N(1-s), N(1+s)] (same mean)
FRONTEND_SPREAD = 0.5


@dataclass(frozen=True)
class CalibrationSpread:
    """Part (a): the relative half-width from the profile's leave-one-out errors."""

    rel: float
    points: int  # measured points it rests on (0: the default)
    regime: str
    basis: str  # one line: where the number comes from


def regime(tp: int, pp: int, conc: int | None) -> tuple[str, str]:
    """A scenario's (load, split) regime: single requests and batches fail differently
    (CPU- vs GPU-bound), and so do pipelines and TP-only runs (bubbles, P2P)."""
    return ("C=1" if conc == 1 else "batched", "PP" if pp > 1 else "TP")


def loo_residuals(profile) -> list[tuple[object, float]]:
    """(point, leave-one-out relative error) of the profile's measured points, as its
    fit stored them in profile.toml [fit.loo_error_pct] (point label -> %)."""
    stored = profile.meta.get("fit", {}).get("loo_error_pct", {})
    if not isinstance(stored, dict):
        return []
    return [(p, float(stored[p.label()]) / 100) for p in profile.measured if p.label() in stored]


def calibration_spread(profile, tp: int, pp: int, conc: int | None) -> CalibrationSpread:
    """Part (a) for a scenario: the regime's points if enough, else all points if
    enough, else the stated default."""
    want = regime(tp, pp, conc)
    res = loo_residuals(profile)
    for label, chosen in (
        (f"{want[0]}, {want[1]}", [e for p, e in res if regime(p.tp, p.pp, p.conc) == want]),
        (want[0], [e for p, e in res if regime(p.tp, p.pp, p.conc)[0] == want[0]]),
        ("all", [e for _, e in res]),
    ):
        if len(chosen) >= MIN_POINTS:
            q = float(np.quantile(np.abs(chosen), LIKELY_COVERAGE))
            return CalibrationSpread(
                q,
                len(chosen),
                label,
                f"80% quantile of |leave-one-out error| over {len(chosen)} points ({label})",
            )
    fit = profile.meta.get("fit", {})
    loo = f"; its fit's leave-one-out MAPE is {fit['loo_mape_pct']}%" if "loo_mape_pct" in fit else ""
    n = len(profile.measured)
    return CalibrationSpread(
        DEFAULT_CALIBRATION_REL,
        0,
        "default",
        f"profile {profile.name} has {len(res)} leave-one-out residuals of {n} points "
        f"(fewer than {MIN_POINTS}){loo}: default {DEFAULT_CALIBRATION_REL:.0%}",
    )


def _spread(lengths, s: float):
    from .workload import Lengths

    if lengths.lo != lengths.hi:
        return lengths  # the user gave a distribution: keep it
    n = lengths.lo
    return Lengths(max(1, round(n * (1 - s))), max(1, round(n * (1 + s))))


def ensemble_scenarios(scenario, runs: int = ENSEMBLE_RUNS) -> list:
    """Part (b)'s members: the scenario with seed 1..runs, fixed lengths widened to a
    uniform spread of the same mean, and a non-zero front-end cost alternately -+50%.
    A trace is replayed as given (its lengths and arrivals are pinned): seeds only."""
    w = scenario.workload
    members = []
    for i in range(1, runs + 1):
        wi = replace(w, seed=w.seed + i)
        if w.kind != "trace":
            wi = replace(
                wi,
                input_len=_spread(w.input_len, LENGTH_SPREAD),
                output_len=_spread(w.output_len, LENGTH_SPREAD),
            )
        prof = scenario.profile
        if prof.params.frontend_ms > 0:
            f = 1 + FRONTEND_SPREAD * (1 if i % 2 else -1)
            prof = prof.with_params(frontend_ms=prof.params.frontend_ms * f)
        members.append(replace(scenario, workload=wi, profile=prof))
    return members


def _values(result) -> dict:
    return {m: getattr(result, m) for m in HEADLINE}


def ensemble_spread(scenario, runs: int = ENSEMBLE_RUNS) -> dict:
    """Part (b): metric -> relative half-width (Z_LIKELY x std / mean of the members),
    each member a short fixed-length run (C warm-up, max(2C, 16) measured)."""
    from .api import run

    vals = []
    for sc in ensemble_scenarios(scenario, runs):
        vals.append(_values(run(sc, ci_target=None)))
    out = {}
    for m in HEADLINE:
        x = np.array([v[m] for v in vals], dtype=float)
        x = x[np.isfinite(x)]
        out[m] = float(Z_LIKELY * x.std(ddof=1) / abs(x.mean())) if len(x) >= 2 and x.mean() else 0.0
    return out


def band(value: float, rel: float) -> tuple[float, float]:
    """The multiplicative band [v / (1 + rel), v (1 + rel)]."""
    if not math.isfinite(value):
        return (float("nan"), float("nan"))
    return (value / (1 + rel), value * (1 + rel))


def intervals(result, scenario, ensemble: bool = True, runs: int = ENSEMBLE_RUNS) -> tuple[dict, dict]:
    """(intervals, basis) for a Result of `scenario`: metric -> (lo, hi), and what each
    part contributed. `ensemble=False` is the cheap form (a) + (c), no extra run."""
    w = scenario.workload
    cal = calibration_spread(
        scenario.profile, scenario.plan.tp, scenario.plan.pp, w.concurrency if w.kind == "closed" else None
    )
    ens = ensemble_spread(scenario, runs) if ensemble else {m: 0.0 for m in HEADLINE}
    v = result.output_throughput_tok_s
    ci = (
        result.output_throughput_ci_tok_s / v * Z_LIKELY / Z_CI
        if v and math.isfinite(result.output_throughput_ci_tok_s)
        else 0.0
    )
    out, parts = {}, {}
    for m in HEADLINE:
        sim = ci if m == "output_throughput_tok_s" else 0.0
        rel = math.sqrt(cal.rel**2 + ens[m] ** 2 + sim**2)
        out[m] = band(getattr(result, m), rel)
        parts[m] = {"calibration": cal.rel, "workload": ens[m], "simulation": sim, "combined": rel}
    basis = {
        "coverage": LIKELY_COVERAGE,
        "calibration": cal.basis,
        "calibration_regime": cal.regime,
        "workload": f"{runs} short runs (seeds, lengths +-{LENGTH_SPREAD:.0%}, front-end cost +-{FRONTEND_SPREAD:.0%})"
        if ensemble
        else "not run (--no-intervals ensemble: calibration and simulation only)",
        "rule": "relative half-widths in quadrature; band [v/(1+r), v(1+r)]",
        "parts": parts,
    }
    return out, basis


def attach(result, scenario, ensemble: bool = True, runs: int = ENSEMBLE_RUNS):
    """The result with its `intervals` and `interval_basis` filled in."""
    iv, basis = intervals(result, scenario, ensemble, runs)
    return replace(result, intervals=iv, interval_basis=basis)


def likely(result, metric: str, fmt: str = "{:,.0f}") -> str:
    """' (likely LO-HI)' for the table, or '' when the result carries no interval."""
    iv = getattr(result, "intervals", None) or {}
    if metric not in iv or not all(map(math.isfinite, iv[metric])):
        return ""
    lo, hi = iv[metric]
    return f" (likely {fmt.format(lo)}-{fmt.format(hi)})"

"""Prediction intervals: how far to trust a headline number (docs/uncertainty.md).

A prediction is wrong for three independent reasons, each turned into a relative
half-width of a "likely" band (about 80% coverage, a 1.28-sigma band):

(a) calibration: the profile predicts points it was not fitted to only as well as
    its leave-one-out errors say; the 80% quantile of |LOO error| over the measured
    points of the scenario's regime (C = 1 or batched, PP or TP only), where at least
    MIN_POINTS exist; with fewer, the largest of the profile's errors (never a smaller
    default); with none, DEFAULT_CALIBRATION_REL, said so in the basis. The
    share of the prediction's stage time priced by the roofline or borrowed from
    another box carries instead the error measured for such predictions on the public
    corpus (residual_band.py), blended with the profile's part by that share;
(b) workload: the spread of what the user did not pin, at the size of a short run
    (C warm-up, max(2C, 16) measured; an open loop's whole run). By default from the
    run itself, no extra run (`run_spread`: batch means over stretches of its measured
    requests, arrival order and sampling at the lengths as given; an open loop's or a
    trace's stretches folded as its requests finished, measure/stretches.py); with
    `workload="ensemble"` (`--ensemble`) from ENSEMBLE_RUNS short runs more, which also
    widen fixed lengths and move a front-end cost (`ensemble_spread`);
(c) simulation: the run's own 95% confidence half-width, rescaled to 80%.

They are combined in quadrature, rel = sqrt(a^2 + b^2 + c^2) (each feature no
measurement has checked, unchecked.py, one more part of DEFAULT_CALIBRATION_REL), and the band is
multiplicative, [v / (1 + rel), v * (1 + rel)], so it stays positive however wide.
Where the corpus residuals are biased (a roofline over-predicts throughput), the
headline itself is corrected: v' = v x exp(u x median residual), u the unmeasured share,
and the band runs from the residuals' 10% to their 90% quantile around it (widths
median - q10 below, q90 - median above, blended with the profile's part by u), so the
headline is the band's median and never outside it. `attach` applies the correction to
the Result's figures of each residual group and keeps the simulation's own values in
`interval_basis["uncorrected"]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..measure.sketch import percentile
from ..measure.stretches import spread as stretch_spread
from .residual_band import (
    CORRECTED,
    RESIDUAL_GROUP,
    UNMEASURED,
    Residuals,
    band_log,
    corpus_residuals,
    corrected,
    correction,
    table_residuals,
    unmeasured_share,
)
from .unchecked import unchecked

if TYPE_CHECKING:
    from ..inputs.workload import Lengths
    from ..measure.metrics import Result
    from ..profiles.measured import Point
    from ..profiles.profile import Profile
    from ..scenario.build import Scenario

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
RUN_BATCHES = 4  # the run's own spread: at least this many stretches of its requests
WORKLOAD_METHODS = ("run", "ensemble", "none")
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


def loo_residuals(profile: Profile) -> list[tuple[Point, float]]:
    """(point, leave-one-out relative error) of the profile's measured points, as its
    fit stored them in profile.toml [fit.loo_error_pct] (point label -> %)."""
    stored = profile.meta.get("fit", {}).get("loo_error_pct", {})
    if not isinstance(stored, dict):
        return []
    return [(p, float(stored[p.label()]) / 100) for p in profile.measured if p.label() in stored]


def calibration_spread(profile: Profile, tp: int, pp: int, conc: int | None) -> CalibrationSpread:
    """Part (a) for a scenario: the regime's points if enough, else the load class's,
    else all points if enough. A profile with fewer leave-one-out errors than that still
    measured them: it uses the largest (with n errors, the rank rule p(n + 1) puts the
    80% quantile at or beyond the largest for n < 5: the largest of n errors is exceeded
    about 1 / (n + 1) of the time), never a smaller default. Only a profile with no
    leave-one-out error at all gets the stated default."""
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
    n = len(profile.measured)
    if res:
        largest = max(abs(e) for _, e in res)
        errors = ", ".join(f"{abs(e):.0%}" for _, e in sorted(res, key=lambda pe: -abs(pe[1])))
        rel = max(largest, DEFAULT_CALIBRATION_REL)
        floor = (
            f", raised to the default {DEFAULT_CALIBRATION_REL:.0%}"
            if largest < DEFAULT_CALIBRATION_REL
            else ""
        )
        return CalibrationSpread(
            rel,
            len(res),
            "largest",
            f"profile {profile.name}'s {len(res)} leave-one-out errors ({errors}; fewer than {MIN_POINTS} "
            f"for a quantile): the largest, {largest:.0%}{floor}",
        )
    return CalibrationSpread(
        DEFAULT_CALIBRATION_REL,
        0,
        "default",
        f"profile {profile.name} has no leave-one-out error ({n} measured points): "
        f"the stated default {DEFAULT_CALIBRATION_REL:.0%}",
    )


def _spread(lengths: Lengths, s: float) -> Lengths:
    from ..inputs.workload import Lengths

    if lengths.lo != lengths.hi:
        return lengths  # the user gave a distribution: keep it
    n = lengths.lo
    return Lengths(max(1, round(n * (1 - s))), max(1, round(n * (1 + s))))


def takes_ensemble(scenario: Scenario, workload: str) -> bool:
    """Whether intervals of `workload` run the ensemble (ENSEMBLE_RUNS runs more): only
    when asked for (--ensemble), and never for a trace, which pins its arrivals and
    lengths (every run takes its workload part from its own stretches: `attach`)."""
    return workload == "ensemble" and scenario.workload.kind != "trace"


def ensemble_scenarios(scenario: Scenario, runs: int = ENSEMBLE_RUNS) -> list[Scenario]:
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


def _values(result: Result) -> dict:
    return {m: getattr(result, m) for m in HEADLINE}


def ensemble_spread(scenario: Scenario, runs: int = ENSEMBLE_RUNS) -> dict:
    """Part (b): metric -> relative half-width (Z_LIKELY x std / mean of the members),
    each member a short fixed-length run (C warm-up, max(2C, 16) measured). A trace's
    members differ in their seed only, which a replay does not read (its arrivals and
    lengths are pinned): the same run each time, so 0 without running them."""
    from ..sim.runner import run

    if scenario.workload.kind == "trace":
        return dict.fromkeys(HEADLINE, 0.0)

    vals = []
    for sc in ensemble_scenarios(scenario, runs):
        vals.append(_values(run(sc, ci_target=None)))
    out = {}
    for m in HEADLINE:
        x = np.array([v[m] for v in vals], dtype=float)
        x = x[np.isfinite(x)]
        out[m] = float(Z_LIKELY * x.std(ddof=1) / abs(x.mean())) if len(x) >= 2 and x.mean() else 0.0
    return out


def member_requests(scenario: Scenario) -> int:
    """Measured requests of one ensemble member: a closed loop's short run measures
    max(2A, 16), A the requests the engine admits at once (scenario/admission.py); an open loop
    or a trace is measured whole."""
    from ..scenario.admission import admission

    w = scenario.workload
    if w.kind != "closed":
        return 0  # the whole run
    return max(2 * admission(w, scenario.settings, scenario.plan.dp).admitted, 16)


def _stretch_values(cols: dict, idx: np.ndarray, throughput: float) -> dict:
    """The headline metrics of one stretch of the run's requests."""
    speeds = cols["decode_tok_s"][idx]
    speeds = speeds[np.isfinite(speeds)]
    out = {
        "output_throughput_tok_s": throughput,
        "per_request_tok_s": float(speeds.mean()) if len(speeds) else np.nan,
    }
    for m, col, q in (
        ("ttft_ms_p50", "ttft_ms", 50),
        ("ttft_ms_p99", "ttft_ms", 99),
        ("tpot_ms_p50", "tpot_ms", 50),
        ("tpot_ms_p99", "tpot_ms", 99),
    ):
        x = cols[col][idx]
        x = x[np.isfinite(x)]
        out[m] = percentile(x, q)
    return out


def run_spread(result: Result, scenario: Scenario) -> dict:
    """Part (b) from the run itself, no extra run. An open loop is measured whole, so
    its member is the run: its stretches of consecutive arrivals (Result.stretch_samples,
    folded as its requests finished) give metric -> Z_LIKELY x the spread of a whole
    run's figure / its mean (measure/stretches.py). A trace pins its arrivals and
    lengths: 0, as its ensemble is (`ensemble_spread`). A closed loop's measured
    requests, in completion order, are cut into k stretches of at least one member's
    size (k = requests // member size), or into RUN_BATCHES smaller ones when the run
    holds fewer members than that (unless it repeats: then RUN_BATCHES member-sized
    stretches of its periodic continuation); each stretch is one sample of every headline
    metric, throughput as steady.py estimates it: C x sum(output) / sum(latency)
    (renewal-reward, robust to the waves a fixed-length loop runs in). A member's
    spread is the samples' standard deviation x sqrt(stretch / member size) (a mean
    over n requests varies as 1/sqrt(n)); metric -> Z_LIKELY x that / mean."""
    if scenario.workload.kind == "trace":
        return dict.fromkeys(HEADLINE, 0.0)  # pinned: nothing left to the workload (ensemble_spread)
    if scenario.workload.kind != "closed":
        samples = result.stretch_samples
        return {m: stretch_spread(samples.get(m, []), Z_LIKELY) for m in HEADLINE}
    cols = result.request_columns
    n = len(cols["finish_s"])
    member = member_requests(scenario) or n
    k = n // member if n >= RUN_BATCHES * member else RUN_BATCHES
    if n < 2 * k:
        return dict.fromkeys(HEADLINE, 0.0)
    finish, out_len = cols["finish_s"], cols["output_len"].astype(float)
    w = scenario.workload
    e2e_s = cols["e2e_ms"] * 1e-3
    order = np.argsort(finish, kind="stable")
    stretches, size = np.array_split(order, k), n / k
    p = result.period_requests
    if p and n % p == 0 and n < RUN_BATCHES * member:
        # a run of whole periods of p requests (steady.period) is the start of its own
        # periodic continuation: RUN_BATCHES member-sized stretches are read off that,
        # as from a longer run, starting at phases spread over one period
        starts = np.arange(RUN_BATCHES) * p // RUN_BATCHES
        stretches, size = [order[(a + np.arange(member)) % n] for a in starts], member
    by_stretch = []
    for g in stretches:
        lat = e2e_s[g].sum()
        by_stretch.append(
            _stretch_values(cols, g, w.concurrency * out_len[g].sum() / lat if lat > 0 else np.nan)
        )
    scale = math.sqrt(size / member)
    spread = {}
    for m in HEADLINE:
        x = np.array([v[m] for v in by_stretch], dtype=float)
        x = x[np.isfinite(x)]
        ok = len(x) >= 2 and x.mean() != 0
        spread[m] = float(Z_LIKELY * x.std(ddof=1) * scale / abs(x.mean())) if ok else 0.0
    return spread


def band(value: float, rel: float) -> tuple[float, float]:
    """The multiplicative band [v / (1 + rel), v (1 + rel)]."""
    if not math.isfinite(value):
        return (float("nan"), float("nan"))
    return (value / (1 + rel), value * (1 + rel))


def intervals(
    result: Result, scenario: Scenario, workload: str = "run", runs: int = ENSEMBLE_RUNS
) -> tuple[dict, dict]:
    """(intervals, basis) for a Result of `scenario`: metric -> (lo, hi) around the
    corrected headline (`corrected` applies it), and what each part contributed. `workload` is how part (b) is estimated (WORKLOAD_METHODS): "run"
    from the run itself (no extra run), "ensemble" from `runs` short runs more, "none"
    left out ((a) + (c) only)."""
    if workload not in WORKLOAD_METHODS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOAD_METHODS)}, got {workload!r}")
    w = scenario.workload
    cal = calibration_spread(
        scenario.profile, scenario.plan.tp, scenario.plan.pp, w.concurrency if w.kind == "closed" else None
    )
    if workload != "none" and w.kind == "trace":
        ens = dict.fromkeys(HEADLINE, 0.0)
        how = "none: a trace pins its arrivals and lengths (an ensemble's members would be the same run)"
    elif workload == "ensemble":
        ens = ensemble_spread(scenario, runs)
        how = f"{runs} short runs (seeds, lengths +-{LENGTH_SPREAD:.0%}, front-end cost +-{FRONTEND_SPREAD:.0%})"
    elif workload == "run":
        ens = run_spread(result, scenario)
        size = "short-run-sized stretches" if w.kind == "closed" else "stretches"
        how = (
            f"the run's own spread: batch means over {size} of its requests "
            "(arrival order and sampling at the lengths as given; --ensemble also widens them)"
        )
    else:
        ens = dict.fromkeys(HEADLINE, 0.0)
        how = "not estimated (calibration and simulation only)"
    v = result.output_throughput_tok_s
    ci = (
        result.output_throughput_ci_tok_s / v * Z_LIKELY / Z_CI
        if v and math.isfinite(result.output_throughput_ci_tok_s)
        else 0.0
    )
    share = unmeasured_share(result)
    res = corpus_residuals()
    features = unchecked(scenario)
    wider = (DEFAULT_CALIBRATION_REL,) * len(features)  # each unchecked feature, in quadrature
    # a profile with no measured point of its own (a catalogue profile) carries, on its
    # measured share, the corpus's error of such predictions instead of the default
    tables = table_residuals() if not scenario.profile.measured else {}
    out, parts = {}, {}
    for m in HEADLINE:
        sim = ci if m == "output_throughput_tok_s" else 0.0
        centre, below, above = band_log(m, cal.rel, share, (ens[m], sim, *wider), res, tables)
        v = getattr(result, m) * math.exp(centre)  # the headline, corrected
        out[m] = (v * math.exp(-below), v * math.exp(above)) if math.isfinite(v) else band(v, 0)
        parts[m] = {
            "calibration": cal.rel,
            "workload": ens[m],
            "simulation": sim,
            "unchecked": math.sqrt(len(wider)) * DEFAULT_CALIBRATION_REL,
            "combined": math.expm1((below + above) / 2),
            "centre_log": centre,
            "below_log": below,
            "above_log": above,
        }
    factors = correction(share, res, tables)
    cal_text = cal.basis
    if tables and share < 1:
        cal_text = (
            f"profile {scenario.profile.name} has no measured point of its own: its measured share "
            f"({1 - share:.0%} of the stage time) carries the corpus's measured error of predictions by "
            "measured tables with the host loop's defaults, its median applied to the headline "
            "(pipesim/data/residuals.json table_groups; docs/residuals.md)"
        )
    if share > 0 and res:
        cal_text += (
            f"; {share:.0%} of the stage time is roofline or borrowed: that share carries the corpus's "
            f"measured error for such predictions, its median applied to the headline "
            f"(pipesim/data/residuals.json)"
        )
    basis = {
        "coverage": LIKELY_COVERAGE,
        "unmeasured_share": share,
        "calibration": cal_text,
        "calibration_regime": "corpus tables" if tables and share < 1 else cal.regime,
        "table_band": bool(tables),
        "workload": how,
        "workload_method": workload,
        "unchecked": [{"feature": u.feature, "why": u.why} for u in features],
        "unchecked_rel": DEFAULT_CALIBRATION_REL,
        "rule": (
            "relative half-widths in quadrature (each unchecked feature one more part of the default size); "
            "headline v' = v e^c (c = u x the roofline residuals' median + (1 - u) x the table residuals' median "
            "for a profile without measured points, else 0 on the measured share), band [v' e^-below, v' e^above]"
        ),
        "parts": parts,
        "correction": factors,
        "uncorrected": {
            f: getattr(result, f) for fs in CORRECTED.values() for f in (*fs, "per_request_tok_s")
        },
    }
    return out, basis


def attach(result: Result, scenario: Scenario, workload: str = "run", runs: int = ENSEMBLE_RUNS) -> Result:
    """The result with its `intervals` and `interval_basis` filled in, its headline
    figures corrected by the corpus residuals' median (module docstring)."""
    iv, basis = intervals(result, scenario, workload, runs)
    return replace(corrected(result, basis), intervals=iv, interval_basis=basis)


def likely(result: Result, metric: str, fmt: str = "{:,.0f}") -> str:
    """' (likely LO-HI)' for the table, or '' when the result carries no interval."""
    iv = getattr(result, "intervals", None) or {}
    if metric not in iv or not all(map(math.isfinite, iv[metric])):
        return ""
    lo, hi = iv[metric]
    return f" (likely {fmt.format(lo)}-{fmt.format(hi)})"


# the corpus residuals' part, kept importable from here (residual_band.py)
__all__ = [
    "CORRECTED",
    "HEADLINE",
    "RESIDUAL_GROUP",
    "UNMEASURED",
    "Residuals",
    "attach",
    "band",
    "band_log",
    "corpus_residuals",
    "corrected",
    "correction",
    "table_residuals",
    "intervals",
    "likely",
    "unmeasured_share",
]

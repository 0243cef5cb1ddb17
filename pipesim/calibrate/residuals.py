"""The corpus residuals of unmeasured predictions: how far a prediction priced by the
roofline (or borrowed from another box) lands from what was measured.

Fitted by code from named data: the compared numbers of `pipesim validate --corpus`
(pipesim.calibrate.crosscheck; the public corpus in validation/, docs/validation.md)
whose prediction had at least MIN_SHARE of its stage time unmeasured. For each residual
group of pipesim.report.uncertainty.RESIDUAL_GROUP (throughput, TTFT, TPOT) the 10%, 50% and
90% quantiles of log(measured / predicted) (the median corrects the headline, the others
are the band's edges), each run weighted once per group (a run's
output tok/s, total tok/s and request rate carry one error, not three). Written to
pipesim/data/residuals.json by calibration/fit_residuals.py; pipesim.report.uncertainty reads it.

Because the band is then fitted on the corpus it is checked on, its coverage is also
reported leave-one-out (`loso`): each source's numbers against a band fitted to the
other sources alone, and, stricter, each publisher's against the other publishers'
(GPUStack's 17 pages share one method). Those are the honest figures; the in-sample
one is ~80% by construction.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..report.residual_band import RESIDUAL_GROUP, Residuals, band_log
from ..report.uncertainty import LIKELY_COVERAGE

MIN_SHARE = 0.5  # a prediction with at least this share of unmeasured stage time
MIN_NUMBERS = 10  # a group fitted on fewer numbers is left out (no roofline band)
Q_LO, Q_HI = (1 - LIKELY_COVERAGE) / 2, (1 + LIKELY_COVERAGE) / 2


def residual_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The compared numbers the fit uses, with their group, log residual and weight."""
    r = rows[(rows.unmeasured_share >= MIN_SHARE) & (rows.predicted > 0) & (rows.measured > 0)].copy()
    r["group"] = [RESIDUAL_GROUP[f][0] for f in r.family]
    sign = np.array([RESIDUAL_GROUP[f][1] for f in r.family], dtype=float)
    r["log_residual"] = sign * np.log(r.measured.to_numpy(float) / r.predicted.to_numpy(float))
    r["weight"] = 1.0 / r.groupby(["run_id", "group"]).row_id.transform("size")
    return r


def weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """The q-quantile of x under weights w (the inverse of the weighted empirical CDF,
    interpolated at the mid-points of each weight)."""
    order = np.argsort(x)
    x, w = x[order], w[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return float(np.interp(q, cum, x))


def fit(rows: pd.DataFrame) -> dict[str, Residuals]:
    """Group -> Residuals from compared rows (crosscheck.check(...).rows)."""
    r = residual_rows(rows)
    out = {}
    for group, g in r.groupby("group"):
        if len(g) < MIN_NUMBERS:
            continue
        x, w = g.log_residual.to_numpy(float), g.weight.to_numpy(float)
        q_lo, q_mid, q_hi = (weighted_quantile(x, w, q) for q in (Q_LO, 0.5, Q_HI))
        out[str(group)] = Residuals(q_lo, q_hi, len(g), q_mid)  # a RESIDUAL_GROUP name
    return out


def inside(rows: pd.DataFrame, residuals: dict[str, Residuals]) -> np.ndarray:
    """Whether each measured value falls in the band the residuals give its prediction
    (the cheap band of crosscheck: calibration and the run's CI, no ensemble)."""
    out = []
    r: Any  # a row: its columns' values (the stubs make each field any scalar)
    for r in rows.itertuples():
        c, below, above = band_log(
            r.family, r.calibration_rel, r.unmeasured_share, (0.0, r.simulation_rel), residuals
        )
        out.append(r.predicted * math.exp(c - below) <= r.measured <= r.predicted * math.exp(c + above))
    return np.array(out, dtype=bool)


def publisher(source_id: str) -> str:
    """The publisher of a corpus source: GPUStack's performance-lab pages are one
    (validation/README.md: one method, one lab, 17 pages); every other source is its own."""
    return "gpustack-perflab" if source_id.startswith("gpustack-perflab-") else source_id


def loso(rows: pd.DataFrame, by: str = "source") -> pd.DataFrame:
    """Leave-one-out coverage: per source (`by="source"`) or per publisher
    (`by="publisher"`, the stricter split), its numbers inside a band fitted to every
    other one's numbers (without the roofline part where the others leave a group too
    thin to fit)."""
    keys = rows.source_id if by == "source" else rows.source_id.map(publisher)
    out = []
    for key in sorted(keys.unique()):
        held = rows[keys == key]
        ok = inside(held, fit(rows[keys != key]))
        out.append({"held_out": key, "numbers": len(held), "inside": int(ok.sum()), "coverage": ok.mean()})
    return pd.DataFrame(out, columns=["held_out", "numbers", "inside", "coverage"])


def corrected_error(rows: pd.DataFrame, by: str = "source") -> pd.DataFrame:
    """Per compared number, |error| % of the prediction as printed (the headline corrected
    by the residuals' median, uncertainty.band_log's centre) with the median fitted to
    every other source (`by="source"`) or publisher, never to the number's own."""
    keys = rows.source_id if by == "source" else rows.source_id.map(publisher)
    out = []
    r: Any  # a row: its columns' values (the stubs make each field any scalar)
    for key in sorted(keys.unique()):
        held = rows[keys == key]
        res = fit(rows[keys != key])
        for r in held.itertuples():
            c = band_log(r.family, r.calibration_rel, r.unmeasured_share, (), res)[0]
            out.append(
                {
                    "row_id": r.row_id,
                    "metric": r.metric,
                    "error_pct": (r.predicted * math.exp(c) / r.measured - 1) * 100,
                }
            )
    return pd.DataFrame(out, columns=["row_id", "metric", "error_pct"])


def to_json(residuals: dict[str, Residuals], rows: pd.DataFrame) -> dict:
    """residuals.json: the groups and what they were fitted from."""
    r = residual_rows(rows)
    return {
        "_source": (
            "Fitted by calibration/fit_residuals.py (pipesim.calibrate.residuals) to the compared numbers of "
            "`pipesim validate --corpus` (validation/, docs/validation.md) whose prediction had at least "
            f"{MIN_SHARE:.0%} of its stage time priced by the roofline or borrowed: the "
            f"{Q_LO:.0%}, 50% and {Q_HI:.0%} quantiles of log(measured / predicted) per group, each run "
            "weighted once per group: the median corrects the headline, the others are the band's edges. "
            "docs/uncertainty.md says how a band uses them."
        ),
        "fitted_on": {
            "numbers": len(r),
            "runs": int(r.run_id.nunique()),
            "sources": sorted(r.source_id.unique().tolist()),
        },
        "groups": {
            g: {
                "q_lo": round(v.q_lo, 6),
                "q_mid": round(v.q_mid, 6),
                "q_hi": round(v.q_hi, 6),
                "numbers": v.numbers,
            }
            for g, v in sorted(residuals.items())
        },
    }

"""The corpus residuals of predictions: how far a prediction priced by the roofline (or
borrowed from another box), or by measured tables with no measured point of the
profile's own, lands from what was measured.

Fitted by code from named data: the compared numbers of `pipesim validate --corpus`
(pipesim.calibrate.crosscheck; the public corpus in validation/, docs/validation.md):
the roofline path's numbers whose prediction had at least MIN_SHARE of its stage time
unmeasured (`groups`), and the user path's numbers whose prediction had less, by a
profile with no measured point of its own (`table_groups`: AIConfigurator's tables and
the host loop's defaults). For each residual group of
pipesim.report.residual_band.RESIDUAL_GROUP (throughput, TTFT, TPOT) the 10%, 50% and
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


KINDS = ("roofline", "tables")


def residual_rows(rows: pd.DataFrame, kind: str = "roofline") -> pd.DataFrame:
    """The compared numbers a fit uses, with their group, log residual and weight:
    `roofline`, those with at least MIN_SHARE of their stage time unmeasured; `tables`,
    those with less, by a profile with no measured point of its own (`table_band`)."""
    ok = (rows.predicted > 0) & (rows.measured > 0)
    if kind == "roofline":
        ok &= rows.unmeasured_share >= MIN_SHARE
    else:
        band = rows.table_band if "table_band" in rows else pd.Series(False, index=rows.index)
        ok &= (rows.unmeasured_share < MIN_SHARE) & band.astype(bool)
    r = rows[ok].copy()
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


def fit(rows: pd.DataFrame, kind: str = "roofline") -> dict[str, Residuals]:
    """Group -> Residuals from compared rows (crosscheck.check(...).rows) of one kind
    (residual_rows)."""
    r = residual_rows(rows, kind)
    out: dict[str, Residuals] = {}
    for group, g in r.groupby("group"):
        if len(g) < MIN_NUMBERS:
            continue
        x, w = g.log_residual.to_numpy(float), g.weight.to_numpy(float)
        q_lo, q_mid, q_hi = (weighted_quantile(x, w, q) for q in (Q_LO, 0.5, Q_HI))
        out[str(group)] = Residuals(q_lo, q_hi, len(g), q_mid)  # a RESIDUAL_GROUP name
    return out


def _tables_of(r: object, tables: dict | None) -> dict | None:
    return tables if tables and getattr(r, "table_band", False) else None


def inside(
    rows: pd.DataFrame, residuals: dict[str, Residuals], tables: dict[str, Residuals] | None = None
) -> np.ndarray:
    """Whether each measured value falls in the band the residuals give its prediction
    (the cheap band of crosscheck: calibration and the run's CI, no ensemble); `tables`
    for the rows whose profile had no measured point of its own."""
    out = []
    r: Any  # a row: its columns' values (the stubs make each field any scalar)
    for r in rows.itertuples():
        c, below, above = band_log(
            r.family,
            r.calibration_rel,
            r.unmeasured_share,
            (0.0, r.simulation_rel, getattr(r, "unchecked_rel", 0.0)),  # rows from before it: none
            residuals,
            _tables_of(r, tables),
        )
        out.append(r.predicted * math.exp(c - below) <= r.measured <= r.predicted * math.exp(c + above))
    return np.array(out, dtype=bool)


def publisher(source_id: str) -> str:
    """The publisher of a corpus source: GPUStack's performance-lab pages are one
    (validation/README.md: one method, one lab, 17 pages); every other source is its own."""
    return "gpustack-perflab" if source_id.startswith("gpustack-perflab-") else source_id


def _keys(rows: pd.DataFrame, by: str) -> pd.Series:
    return rows.source_id if by == "source" else rows.source_id.map(publisher)


def loso(rows: pd.DataFrame, by: str = "source", roof: pd.DataFrame | None = None) -> pd.DataFrame:
    """Leave-one-out coverage: per source (`by="source"`) or per publisher
    (`by="publisher"`, the stricter split), its numbers inside a band fitted to every
    other one's numbers: the roofline part on the others' rows of `roof` (the roofline
    path's; `rows` when not given), the tables' part on the others' `rows` (without a
    part where the others leave a group too thin to fit)."""
    roof = rows if roof is None else roof
    keys, roof_keys = _keys(rows, by), _keys(roof, by)
    out = []
    for key in sorted(keys.unique()):
        held = rows[keys == key]
        ok = inside(held, fit(roof[roof_keys != key]), fit(rows[keys != key], "tables"))
        out.append({"held_out": key, "numbers": len(held), "inside": int(ok.sum()), "coverage": ok.mean()})
    return pd.DataFrame(out, columns=["held_out", "numbers", "inside", "coverage"])


def corrected_error(rows: pd.DataFrame, by: str = "source", roof: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per compared number, the error % of the prediction as printed (the headline corrected
    by the residuals' medians, band_log's centre) with the medians fitted to every other
    source (`by="source"`) or publisher, never to the number's own (`roof` as in loso)."""
    roof = rows if roof is None else roof
    keys, roof_keys = _keys(rows, by), _keys(roof, by)
    out = []
    r: Any  # a row: its columns' values (the stubs make each field any scalar)
    for key in sorted(keys.unique()):
        held = rows[keys == key]
        res, tab = fit(roof[roof_keys != key]), fit(rows[keys != key], "tables")
        for r in held.itertuples():
            c = band_log(r.family, r.calibration_rel, r.unmeasured_share, (), res, _tables_of(r, tab))[0]
            out.append(
                {
                    "row_id": r.row_id,
                    "metric": r.metric,
                    "error_pct": (r.predicted * math.exp(c) / r.measured - 1) * 100,
                }
            )
    return pd.DataFrame(out, columns=["row_id", "metric", "error_pct"])


def _on(r: pd.DataFrame) -> dict:
    return {
        "numbers": len(r),
        "runs": int(r.run_id.nunique()),
        "sources": sorted(r.source_id.unique().tolist()),
    }


def _groups_json(residuals: dict[str, Residuals]) -> dict:
    return {
        g: {
            "q_lo": round(v.q_lo, 6),
            "q_mid": round(v.q_mid, 6),
            "q_hi": round(v.q_hi, 6),
            "numbers": v.numbers,
        }
        for g, v in sorted(residuals.items())
    }


def to_json(
    residuals: dict[str, Residuals],
    rows: pd.DataFrame,
    tables: dict[str, Residuals] | None = None,
    user_rows: pd.DataFrame | None = None,
) -> dict:
    """residuals.json: the groups of both kinds and what they were fitted from (`rows`
    the roofline path's, `user_rows` the user path's)."""
    out = {
        "_source": (
            "Fitted by calibration/fit_residuals.py (pipesim.calibrate.residuals) to the compared numbers of "
            "`pipesim validate --corpus` (validation/, docs/validation.md): `groups` to the roofline path's "
            f"numbers whose prediction had at least {MIN_SHARE:.0%} of its stage time priced by the roofline "
            "or borrowed, `table_groups` to the user path's numbers whose prediction had less, by a profile "
            f"with no measured point of its own: the {Q_LO:.0%}, 50% and {Q_HI:.0%} quantiles of "
            "log(measured / predicted) per group, each run weighted once per group: the median corrects the "
            "headline, the others are the band's edges. docs/uncertainty.md says how a band uses them."
        ),
        "fitted_on": _on(residual_rows(rows)),
        "groups": _groups_json(residuals),
    }
    if tables and user_rows is not None:
        out["table_groups_fitted_on"] = _on(residual_rows(user_rows, "tables"))
        out["table_groups"] = _groups_json(tables)
    return out

"""The corpus residuals of a prediction, as a band and a correction (docs/uncertainty.md
"Unmeasured costs" and "Measured tables off their own box").

The share of a prediction's stage time priced by the roofline or borrowed from another
box (`Result.provenance_shares`) carries the error measured for such predictions on the
public corpus: the 10%, 50% and 90% quantiles of log(measured / predicted) of its
roofline-priced numbers (pipesim/data/residuals.json `groups`, fitted by calibration/
fit_residuals.py). The rest, priced by measured tables, carries the profile's own
leave-one-out error where it has measured points, and where it has none (a catalogue
profile: AIConfigurator's tables with the host loop's defaults, never checked on a
serving run of its own) the error measured for such predictions on the corpus
(`table_groups`, fitted on the user path's numbers). Each part's median, on its share,
corrects the headline; its 10% and 90% quantiles are the band's edges around it, the
parts blended by their shares.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..measure.metrics import Result

# cost provenances (costs.PROVENANCE) whose error the corpus residuals stand for
UNMEASURED = ("roofline", "roofline (fitted)", "borrowed")
# headline metric -> (residual group, sign): per-request tok/s is 1 / TPOT
RESIDUAL_GROUP = {
    "output_throughput_tok_s": ("throughput", 1),
    "per_request_tok_s": ("tpot", -1),
    "ttft_ms_p50": ("ttft", 1),
    "ttft_ms_p99": ("ttft", 1),
    "tpot_ms_p50": ("tpot", 1),
    "tpot_ms_p99": ("tpot", 1),
}


# Result fields each residual group corrects (per-request tok/s is 1 / TPOT: divided)
CORRECTED = {
    "throughput": ("output_throughput_tok_s", "output_throughput_ci_tok_s", "request_throughput_req_s"),
    "ttft": ("ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99"),
    "tpot": ("tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p99", "e2e_ms_mean"),
}


@dataclass(frozen=True)
class Residuals:
    """Quantiles of log(measured / predicted) of one group of corpus numbers."""

    q_lo: float  # 10% quantile
    q_hi: float  # 90% quantile
    numbers: int
    q_mid: float = math.nan  # median (the correction); absent: the middle of q_lo and q_hi

    @property
    def mid(self) -> float:
        return self.q_mid if math.isfinite(self.q_mid) else (self.q_lo + self.q_hi) / 2


@cache
def _residuals_file() -> dict:
    f = resources.files("pipesim.data").joinpath("residuals.json")
    return json.loads(f.read_text()) if f.is_file() else {}


def _groups(data: dict) -> dict[str, Residuals]:
    return {
        g: Residuals(v["q_lo"], v["q_hi"], v["numbers"], v.get("q_mid", math.nan)) for g, v in data.items()
    }


def corpus_residuals() -> dict[str, Residuals]:
    """Group -> Residuals of roofline-priced predictions, as calibration/fit_residuals.py
    wrote pipesim/data/residuals.json ({} when the file is absent: no roofline band)."""
    return _groups(_residuals_file().get("groups", {}))


def table_residuals() -> dict[str, Residuals]:
    """Group -> Residuals of predictions by measured tables with no measured point of the
    profile's own (catalogue profiles), from the same file ({}: none fitted)."""
    return _groups(_residuals_file().get("table_groups", {}))


def unmeasured_share(result: Result) -> float:
    """Share of the prediction's stage time priced by the roofline or borrowed."""
    shares = getattr(result, "provenance_shares", None) or {}
    return float(min(1.0, max(0.0, sum(shares.get(k, 0.0) for k in UNMEASURED))))


def _signed(r: Residuals, sign: int) -> tuple[float, float, float]:
    """(lo, mid, hi) of a group for a metric of that sense (per-request tok/s is 1 / TPOT)."""
    return (r.q_lo, r.mid, r.q_hi) if sign > 0 else (-r.q_hi, -r.mid, -r.q_lo)


def band_log(
    metric: str,
    profile_rel: float,
    share: float,
    others: tuple = (),
    residuals: dict | None = None,
    tables: dict | None = None,
) -> tuple[float, float, float]:
    """(centre, lower half-width, upper half-width) of the band in log space, for a
    headline metric; the centre is the correction of the headline.

    The measured share of the stage time (1 - `share`) carries the profile's symmetric
    half-width `profile_rel`, or, given `tables` (the corpus residuals of measured-table
    predictions: a profile with no measured point of its own), their median as its
    centre and their 10% and 90% quantiles as its edges; the unmeasured `share` carries
    the corpus residuals of roofline-priced predictions (`residuals`) likewise. The parts
    are blended linearly by their shares. The other parts (relative half-widths) join
    each side in quadrature as relative widths, so a share of 0 and no `tables` give the
    band [v / (1 + r), v (1 + r)] with r = sqrt(a^2 + b^2 + c^2)."""
    res = corpus_residuals() if residuals is None else residuals
    group, sign = RESIDUAL_GROUP[metric]
    base = math.log1p(profile_rel)
    measured = _signed(tables[group], sign) if tables and group in tables else (-base, 0.0, base)
    parts = [(1 - share, measured)]
    if share > 0:
        parts.append((share, _signed(res[group], sign) if group in res else (-base, 0.0, base)))
    centre = sum(w * mid for w, (_, mid, _) in parts)
    below = sum(w * (mid - lo) for w, (lo, mid, _) in parts)
    above = sum(w * (hi - mid) for w, (_, mid, hi) in parts)
    extra = sum(o**2 for o in others)
    return (
        centre,
        math.log1p(math.sqrt(math.expm1(below) ** 2 + extra)),
        math.log1p(math.sqrt(math.expm1(above) ** 2 + extra)),
    )


def correction(share: float, residuals: dict, tables: dict | None = None) -> dict[str, float]:
    """Group -> the factor its figures are corrected by: e^(the band's centre), each part's
    median on its share (band_log)."""
    out = {}
    for g in CORRECTED:
        c = share * residuals[g].mid if share > 0 and g in residuals else 0.0
        if tables and g in tables:
            c += (1 - share) * tables[g].mid
        out[g] = math.exp(c)
    return out


def corrected(result: Result, basis: dict) -> Result:
    """The result with each residual group's figures multiplied by its correction
    (`basis["correction"]`; per-request tok/s, the inverse of TPOT, divided)."""
    f = basis["correction"]
    values = {field: getattr(result, field) * f[g] for g, fields in CORRECTED.items() for field in fields}
    values["per_request_tok_s"] = result.per_request_tok_s / f["tpot"]
    return replace(result, **values)

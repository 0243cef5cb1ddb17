"""The corpus residuals of unmeasured predictions, as a band and a correction
(docs/uncertainty.md "Unmeasured costs").

The share of a prediction's stage time priced by the roofline or borrowed from another
box (`Result.provenance_shares`) carries the error measured for such predictions on the
public corpus: the 10%, 50% and 90% quantiles of log(measured / predicted) of its
roofline-priced numbers (pipesim/data/residuals.json, fitted by calibration/
fit_residuals.py). The median, on that share, corrects the headline; the other two are
the band's edges around it, blended with the profile's own symmetric part by the share.
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
def corpus_residuals() -> dict[str, Residuals]:
    """Group -> Residuals, as calibration/fit_residuals.py wrote pipesim/data/residuals.json
    ({} when the file is absent: no roofline band)."""
    f = resources.files("pipesim.data").joinpath("residuals.json")
    if not f.is_file():
        return {}
    data = json.loads(f.read_text())
    return {
        g: Residuals(v["q_lo"], v["q_hi"], v["numbers"], v.get("q_mid", math.nan))
        for g, v in data["groups"].items()
    }


def unmeasured_share(result: Result) -> float:
    """Share of the prediction's stage time priced by the roofline or borrowed."""
    shares = getattr(result, "provenance_shares", None) or {}
    return float(min(1.0, max(0.0, sum(shares.get(k, 0.0) for k in UNMEASURED))))


def band_log(
    metric: str, profile_rel: float, share: float, others: tuple = (), residuals: dict | None = None
) -> tuple[float, float, float]:
    """(centre, lower half-width, upper half-width) of the band in log space, for a
    headline metric; the centre is the correction of the headline.

    The calibration part is the profile's symmetric half-width `profile_rel` for the
    measured share of the stage time, and for the unmeasured `share` the corpus
    residuals': their median is the centre, their 10% and 90% quantiles the edges; the
    two are blended linearly by that share. The other parts (relative half-widths) join
    each side in quadrature as relative widths, so a share of 0 gives the band
    [v / (1 + r), v (1 + r)] with r = sqrt(a^2 + b^2 + c^2)."""
    res = corpus_residuals() if residuals is None else residuals
    group, sign = RESIDUAL_GROUP[metric]
    base = math.log1p(profile_rel)
    centre, below, above = 0.0, base, base
    if share > 0 and group in res:
        r = res[group]
        lo, mid, hi = (r.q_lo, r.mid, r.q_hi) if sign > 0 else (-r.q_hi, -r.mid, -r.q_lo)
        centre = share * mid
        below = (1 - share) * base + share * (mid - lo)
        above = (1 - share) * base + share * (hi - mid)
    extra = sum(o**2 for o in others)
    return (
        centre,
        math.log1p(math.sqrt(math.expm1(below) ** 2 + extra)),
        math.log1p(math.sqrt(math.expm1(above) ** 2 + extra)),
    )


def corrected(result: Result, basis: dict) -> Result:
    """The result with each residual group's figures multiplied by its correction
    (`basis["correction"]`; per-request tok/s, the inverse of TPOT, divided)."""
    f = basis["correction"]
    values = {field: getattr(result, field) * f[g] for g, fields in CORRECTED.items() for field in fields}
    values["per_request_tok_s"] = result.per_request_tok_s / f["tpot"]
    return replace(result, **values)

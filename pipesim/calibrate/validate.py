"""Validation: every measured point of a profile, predicted against measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..base.errors import require
from ..base.files import json_text
from ..profiles.profile import Profile
from .fit import points_work, predict_point


def validate(profile: Profile, on_point: Callable[[], object] | None = None) -> pd.DataFrame:
    """One row per measured point: measured (value or band), predicted, error in %
    (0 inside a band, else against the nearer edge). `on_point()` after each (progress)."""
    require(
        profile.measured,
        f"profile {profile.name} has no measured points (add some: pipesim calibrate import bench ...)",
    )
    work, scenarios = points_work(
        profile, profile.measured, "validate", "validate fewer measured points at a time"
    )
    work.add("a run per measured point", scenarios).check()
    rows = []
    for p in profile.measured:
        pred = predict_point(profile, p)
        rows.append(
            {
                "point": p.label(),
                "metric": p.metric,
                "measured_lo": p.lo,
                "measured_hi": p.hi,
                "predicted": pred,
                "error_pct": p.error(pred) * 100,
                "source": p.source,
            }
        )
        if on_point:
            on_point()
    return pd.DataFrame(rows)


def mape(df: pd.DataFrame) -> float:
    """Mean absolute error over the points, in %."""
    return float(np.mean(np.abs(df["error_pct"])))


def table(df: pd.DataFrame, profile: Profile, max_error: float) -> str:
    """The validation as a text table, points outside max_error flagged."""
    lines = [
        f"validation of {profile.name} ({len(df)} measured points)",
        f"  {'point':28s} {'metric':18s} {'measured':>13s} {'predicted':>10s} {'error':>8s}",
    ]
    for r in df.to_dict("records"):
        lo, hi = r["measured_lo"], r["measured_hi"]
        meas = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        flag = "" if abs(r["error_pct"]) <= max_error else "  <- outside"
        lines.append(
            f"  {r['point']:28s} {r['metric']:18s} {meas:>13s} {r['predicted']:10.1f} {r['error_pct']:+7.1f}%{flag}"
        )
    lines.append(f"  MAPE {mape(df):.1f}% (max allowed per point {max_error:g}%)")
    fit = profile.meta.get("fit", {})
    if fit:
        lines.append(
            f"  fitted: {fit.get('params', '')}; leave-one-out MAPE {fit.get('loo_mape_pct', 'n/a')}%"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Validation:
    """A profile's points predicted against measured, and the largest error allowed."""

    profile: Profile
    points: pd.DataFrame
    max_error_pct: float

    @property
    def passed(self) -> bool:
        """Every point within max_error_pct."""
        return not (self.points["error_pct"].abs() > self.max_error_pct).any()

    def text(self) -> str:
        return table(self.points, self.profile, self.max_error_pct)

    def to_json(self) -> str:
        return json_text(
            {
                "profile": self.profile.name,
                "mape_pct": mape(self.points),
                "max_error_pct": self.max_error_pct,
                "points": self.points.to_dict("records"),
            },
            indent=2,
        )


def check(
    profile: str | Path | Profile, max_error_pct: float, on_point: Callable[[], object] | None = None
) -> Validation:
    """Validate a profile (a name, a directory or a loaded one) against its measured points."""
    from ..profiles.profile import load_profile

    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    return Validation(prof, validate(prof, on_point), max_error_pct)

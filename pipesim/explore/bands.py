"""A sweep's likely bands as a planner reads them: how wide they are, and whether a
winner's margin over its runner-up is inside its band (docs/uncertainty.md).

Every row of a sweep table carries its band (`<col>_lo` / `<col>_hi`, the same band
`pipesim predict` prints). A margin inside the winner's band is one the prediction
cannot vouch for on the numbers alone; the bands of two splits priced by one profile
are mostly the calibration error they share, which moves both the same way, so their
order is surer than either number (docs/validation.md: on the public corpus the order
of two splits under one condition is right more often than their numbers).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from .objectives import Row


def band_of(r: Row, col: str) -> tuple[float, float] | None:
    """A row's likely band on `col`, or None where the table has none (a table swept
    with --no-intervals or before bands were kept)."""
    lo, hi = r.get(f"{col}_lo"), r.get(f"{col}_hi")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return float(lo), float(hi)


def margin_text(win: Row, runner: Row, col: str, fmt: str = "{:,.1f}") -> str:
    """' That margin is inside the winner's likely band (A-B): ...' or ' It is outside
    ...' (empty where the table has no band)."""
    band = band_of(win, col)
    if band is None:
        return ""
    lo, hi = band
    inside = lo <= runner[col] <= hi
    where = f"the winner's likely band ({fmt.format(lo)}-{fmt.format(hi)})"
    if inside:
        return (
            f" That margin is inside {where}: the band alone cannot tell the two apart; it is mostly "
            "calibration error they share, so their order is surer than the margin."
        )
    return f" The runner-up lies outside {where}: the margin is larger than the prediction's uncertainty."


def width_text(df: pd.DataFrame, col: str = "output_throughput_tok_s") -> str:
    """One line: the likely band of the table's cells as factors of the value (e.g.
    'likely (80%) bands: each cell's output tok/s lies within /3.81 and x3.80 of it'); ''
    without bands."""
    if f"{col}_lo" not in df.columns or f"{col}_hi" not in df.columns:
        return ""
    v = df[col].to_numpy(float)
    lo, hi = df[f"{col}_lo"].to_numpy(float), df[f"{col}_hi"].to_numpy(float)
    ok = (v > 0) & (lo > 0) & (hi > 0)
    if not ok.any():
        return ""
    down, up = float((v[ok] / lo[ok]).max()), float((hi[ok] / v[ok]).max())
    return (
        f"likely (80%) bands: each cell's output tok/s lies within /{down:.2f} and x{up:.2f} of it at the "
        f"widest (each row's {col}_lo / _hi in the table; docs/uncertainty.md)"
    )


def inside_count(df: pd.DataFrame, keys: list[str], col: str = "output_throughput_tok_s") -> tuple[int, int]:
    """(loads whose runner-up lies inside the best's likely band, loads with a runner-up
    and a band): how often a sweep's '*' is a call the bands cannot make."""
    inside = total = 0
    for _, part in df.groupby(keys, sort=False):
        if len(part) < 2:
            continue
        ranked = part.sort_values(col, ascending=False)
        top, second = ranked.iloc[0], ranked.iloc[1]
        band = band_of(top, col)
        if band is None:
            continue
        total += 1
        inside += band[0] <= second[col] <= band[1]
    return inside, total


def footer(df: pd.DataFrame, keys: list[str]) -> list[str]:
    """The lines a sweep's summary ends with: how wide its bands are, and at how many
    loads the best's margin over the runner-up is inside its band ('*' then marks a
    call the bands cannot make)."""
    width = width_text(df)
    if not width:
        return []
    inside, total = inside_count(df, keys)
    lines = [width]
    if total:
        lines.append(
            f"at {inside} of {total} loads the runner-up lies inside the best's band: there '*' is the "
            "simulation's order, which the band alone cannot confirm"
        )
    return lines

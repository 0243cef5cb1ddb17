"""The bubble-cause figure of a sweep: the micro-batches in flight by slot position,
fullest first, against the load (measure/occupancy.py; the sweep's columns
`occupancy_by_position`, `empty_share_by_position`). plot.py saves it with the others."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..base.errors import require
from ..measure.occupancy import ordinal
from .plot_parts import _conc_axis, _figure, _splits, _subtitle

MARKERS = "osD^vP"


def bubble_cause(df: pd.DataFrame) -> Figure:
    """Why pipeline stages idle: the micro-batches in flight by position, fullest first
    (measure/occupancy.py), against the load, per split: each position's mean requests
    (top) and the share of time it is empty (bottom). A stage computes only a batch in
    flight, so with m of N positions occupied at most m stages work: a position empty
    at every load is a slot the pipeline never fills. Positions that read the same at
    every load are one line ('3rd-8th'); the per-slot cap is drawn where the table has
    it. Rows without positions (DP ranks, a table from before them) are left out."""
    require(
        "occupancy_by_position" in df.columns and "empty_share_by_position" in df.columns,
        "the sweep table has no occupancy_by_position; rerun it with this version of pipesim",
    )
    parts = [(label, part) for label, part in _splits(df) if int(part.pp.iloc[0]) > 1] or list(_splits(df))
    parts = [(label, part[part.occupancy_by_position.notna()]) for label, part in parts]
    parts = [(label, part) for label, part in parts if len(part)]
    require(parts, "no row of the sweep table has slots by position (DP ranks have none)")
    cols = min(3, len(parts))
    rows = math.ceil(len(parts) / cols)
    fig = _figure(max(3.8 * cols + 0.6, 8.0), 4.4 * rows + 1.3)  # the title needs 8 inches
    axes = fig.subplots(2 * rows, cols, squeeze=False, height_ratios=[3, 2] * rows)
    for i, (label, part) in enumerate(parts):
        top, bottom = axes[2 * (i // cols), i % cols], axes[2 * (i // cols) + 1, i % cols]
        means, empty = _positions(part)
        n = means.shape[1]
        what = "group" if str(part.engine.iloc[0]) == "vllm" else "slot"
        for run, (first, last) in enumerate(_same_positions(means, empty)):
            name = ordinal(first + 1) + (f"-{ordinal(last + 1)}" if last > first else "")
            style = dict(marker=MARKERS[run % len(MARKERS)], markersize=3.5, linewidth=1.2, color=f"C{run}")
            style["label"] = name
            top.plot(part.conc, means[:, first], **style)
            bottom.plot(part.conc, 100 * empty[:, first], **style)
        if "slot_cap" in part.columns and int(part.slot_cap.iloc[0]) > 0:
            cap = int(part.slot_cap.iloc[0])
            top.axhline(cap, color="grey", linestyle="--", linewidth=1)
            top.annotate(
                f"per-slot cap {cap}", (0.98, cap), xycoords=("axes fraction", "data"),
                ha="right", va="top", fontsize=7, color="dimgrey",
            )  # fmt: skip
        top.set_title(f"{label} ({n} {what}{'s' if n > 1 else ''})", fontsize=9)
        top.set_ylim(bottom=0)
        bottom.set_ylim(-4, 104)
        for ax in (top, bottom):
            _conc_axis(ax, part.conc)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.3)
        top.set_xlabel("")
        top.tick_params(labelbottom=False)
        bottom.set_xlabel("concurrency C", fontsize=8)
        top.set_ylabel("mean requests", fontsize=8)
        bottom.set_ylabel("time empty (%)", fontsize=8)
        top.legend(title=f"{what} position (fullest first)", title_fontsize=6.5, fontsize=6.5, ncols=2)
    for i in range(len(parts), rows * cols):
        axes[2 * (i // cols), i % cols].set_visible(False)
        axes[2 * (i // cols) + 1, i % cols].set_visible(False)
    fig.suptitle(
        "The bubble's cause: micro-batches in flight by slot position, fullest first, against load\n"
        f"(a stage computes only a batch in flight: an empty position idles the stages it would feed)\n{_subtitle(df)}",
        fontsize=9,
    )
    return fig


def _positions(part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row, each slot position's mean requests and share of time empty (the sweep's
    ';'-joined columns, measure/occupancy.py), as two arrays of rows x positions."""

    def parse(column: str, pad: float) -> np.ndarray:
        rows = [[float(x) for x in str(v).split(";") if x] for v in part[column]]
        n = max(len(r) for r in rows)
        return np.array([r + [pad] * (n - len(r)) for r in rows])

    return parse("occupancy_by_position", 0.0), parse("empty_share_by_position", 1.0)


def _same_positions(means: np.ndarray, empty: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive positions that read the same at every
    load: drawn as one line, they would hide each other."""
    runs: list[tuple[int, int]] = []
    for k in range(means.shape[1]):
        if (
            runs
            and np.array_equal(means[:, k], means[:, runs[-1][0]])
            and np.array_equal(empty[:, k], empty[:, runs[-1][0]])
        ):
            runs[-1] = (runs[-1][0], k)
        else:
            runs.append((k, k))
    return runs

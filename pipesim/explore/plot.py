"""Figures of a sweep: throughput vs concurrency, the per-request vs aggregate
trade-off, and where each split's GPU time goes.

Figures are built on `matplotlib.figure.Figure` (no pyplot, no global backend
switch): saving renders PNG with Agg and SVG with the SVG backend, and a notebook
with the inline backend shows the returned figures as they are.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..base.errors import require
from ..base.files import check_out_path, ensure_dir
from ..base.progress import bar
from ..base.writes import write_atomic, write_files
from .conditions import condition_slug, condition_text, conditions
from .plot_bubble import bubble_cause
from .plot_parts import (
    _annotate_apart,
    _band_note,
    _conc_axis,
    _figure,
    _mark_caps,
    _splits,
    _subtitle,
    _undefined_speed,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from matplotlib.axes import Axes

    from .plot_parts import Label
    from .search import Search, Searches

# GPU time of a stage: these five add up to 100% (metrics.idle_breakdown)
SHARES = (
    ("compute_share", "compute", "#4C72B0"),
    ("allreduce_share", "all-reduce (TP collectives)", "#DD8452"),
    ("idle_p2p_share", "idle: waiting on a P2P hop", "#55A868"),
    ("idle_cpu_share", "idle: waiting on the scheduler CPU", "#8172B3"),
    ("idle_bubble_share", "idle: pipeline bubble", "#C44E52"),
)
FIGURES = ("throughput", "per_gpu", "tradeoff", "breakdown", "bubble_cause")


def throughput(df: pd.DataFrame) -> Figure:
    """Output tok/s vs concurrency, one line per split, each shaded with its likely
    band (80%, the band `pipesim predict` prints; the run's own CI where the table has
    no band)."""
    fig = _figure()
    ax = fig.add_subplot()
    shaded = _band_lines(ax, df, "output_throughput_tok_s")
    _conc_axis(ax, df.conc)
    ax.set_ylabel("output throughput (tok/s, whole engine)")
    ax.grid(True, alpha=0.3)
    ax.legend(title="split", loc="upper left", fontsize=8)
    _mark_caps(ax, df, "output_throughput_tok_s")
    fig.suptitle(
        f"Output throughput vs concurrency\n{shaded}; arrows: a cap stops more requests running\n"
        f"{_subtitle(df)}",
        fontsize=10,
    )
    return fig


def per_gpu(df: pd.DataFrame) -> Figure:
    """Output tok/s per GPU vs concurrency: what each GPU of a split earns (splits of
    different GPU counts compare on cost), each shaded with its likely band."""
    fig = _figure()
    ax = fig.add_subplot()
    per = df.assign(per_gpu=df.output_throughput_tok_s / df.gpus)
    if "output_throughput_tok_s_lo" in df.columns:
        per = per.assign(
            per_gpu_lo=df.output_throughput_tok_s_lo / df.gpus,
            per_gpu_hi=df.output_throughput_tok_s_hi / df.gpus,
        )
    shaded = _band_lines(ax, per, "per_gpu")
    _conc_axis(ax, df.conc)
    ax.set_ylabel("output tok/s per GPU")
    ax.grid(True, alpha=0.3)
    ax.legend(title="split", loc="upper left", fontsize=8)
    _mark_caps(ax, per, "per_gpu")
    fig.suptitle(f"Output throughput per GPU vs concurrency\n{shaded}\n{_subtitle(df)}", fontsize=10)
    return fig


def _band_lines(ax: Axes, df: pd.DataFrame, column: str) -> str:
    """One line per split of `column` against concurrency, shaded with its likely band
    (`<column>_lo` / `_hi`), else, for throughput, the run's 95% CI. Bands wider than a
    factor of two put the y axis on a log scale, where a multiplicative band has the
    same height at every value and the lines stay apart. Returns what the shading is."""
    banded = f"{column}_lo" in df.columns and df[f"{column}_lo"].notna().any()
    for label, part in _splits(df):
        (line,) = ax.plot(part.conc, part[column], marker="o", label=label, zorder=3)
        if banded:
            lo, hi = part[f"{column}_lo"], part[f"{column}_hi"]
        elif column == "output_throughput_tok_s" and "output_throughput_ci_tok_s" in part:
            ci = part.output_throughput_ci_tok_s.fillna(0)
            lo, hi = part[column] - ci, part[column] + ci
        else:
            continue
        ax.fill_between(part.conc, lo, hi, color=line.get_color(), alpha=0.12, linewidth=0)
    if not banded:
        ax.set_ylim(bottom=0)
        return "shaded: the run's 95% CI (the table has no likely band)"
    ratio = (df[f"{column}_hi"] / df[column]).max()
    if ratio > 2:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        return f"shaded: likely band (80%, up to x{ratio:.1f} either way: log scale)"
    ax.set_ylim(bottom=0)
    return "shaded: likely band (80%)"


def tradeoff(df: pd.DataFrame) -> Figure:
    """Per-request tok/s vs aggregate tok/s: each split's curve runs from low
    concurrency (top left: fast requests, little throughput) to high (bottom right)."""
    fig = _figure()
    ax = fig.add_subplot()
    labels: list[Label] = []
    for label, part in _splits(df):
        xs, ys = part.output_throughput_tok_s, part.per_request_tok_s
        (line,) = ax.plot(xs, ys, marker="o", label=label)
        # a point whose speed is not defined (NaN) is not labelled
        labels += [(x, y, str(c), line.get_color()) for x, y, c in zip(xs, ys, part.conc) if y == y]
    _undefined_speed(ax, df)
    ax.set_xlabel("output throughput (tok/s, whole engine)")
    ax.set_ylabel("per-request decode speed (tok/s)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="split", loc="upper right")
    _annotate_apart(ax, labels, fontsize=7)
    fig.suptitle(
        f"Per-request speed vs total throughput (point labels: concurrency C)\n{_band_note(df)}\n{_subtitle(df)}",
        fontsize=10,
    )
    return fig


def pareto_frontier(x: Sequence[float], y: Sequence[float]) -> list[int]:
    """Positions of the points no other point beats on both x and y (larger is better
    on both), in order of increasing x."""
    pts = sorted(range(len(x)), key=lambda i: (-x[i], -y[i]))
    out, best_y = [], -math.inf
    for i in pts:
        if y[i] > best_y:
            out.append(i)
            best_y = y[i]
    return sorted(out, key=lambda i: x[i])


def pareto(result: Search | Searches) -> Figure:
    """A search's trade-off: every swept point (output tok/s vs per-request tok/s),
    filled where it meets the constraints and hollow where it misses them; the Pareto
    frontier of the qualifying points (none is better on both axes); the constraint
    lines; the winner starred. A search of several conditions (`Searches`): one panel
    per condition, titled with it."""
    from .objectives import CONSTRAINTS
    from .search import Searches

    results = result.results if isinstance(result, Searches) else (result,)
    cols = min(2, len(results))
    rows = math.ceil(len(results) / cols)
    fig = _figure(10.5 * cols, 5.5 * rows) if len(results) > 1 else _figure(10.5, 5.5)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, one in zip(axes, results):
        _pareto_axes(ax, one)
        if one.condition:
            ax.set_title(condition_text(one.condition), fontsize=9)
    for ax in axes[len(results) :]:
        ax.set_visible(False)
    slo = (
        ", ".join(CONSTRAINTS[k][2].format(v) for k, v in results[0].constraints.items()) or "no constraints"
    )
    fig.suptitle(
        f"Search trade-off: filled points meet {slo}, hollow ones miss it\n{_band_note(result.table)}\n"
        f"{_subtitle(result.table)}",
        fontsize=10,
    )
    return fig


def _pareto_axes(ax: Axes, result: Search) -> None:
    """One search's points, frontier, constraint lines and winner on `ax`."""
    from .objectives import CONSTRAINTS, load_text
    from .sweep import load_column

    df = result.table
    lc = load_column(df)
    for label, part in _splits(df):
        (line,) = ax.plot(part.output_throughput_tok_s, part.per_request_tok_s, linewidth=0.8, alpha=0.5)
        color = line.get_color()
        ok, bad = part[part.qualifies], part[~part.qualifies]
        ax.scatter(ok.output_throughput_tok_s, ok.per_request_tok_s, color=color, s=28, label=label, zorder=3)
        ax.scatter(
            bad.output_throughput_tok_s,
            bad.per_request_tok_s,
            facecolors="none",
            edgecolors=color,
            s=28,
            zorder=3,
        )
    _undefined_speed(ax, df)
    ok = df[df.qualifies & df.per_request_tok_s.notna()].reset_index(drop=True)
    if len(ok):
        front = ok.iloc[pareto_frontier(ok.output_throughput_tok_s.tolist(), ok.per_request_tok_s.tolist())]
        ax.plot(
            front.output_throughput_tok_s,
            front.per_request_tok_s,
            color="black",
            linewidth=1.6,
            label="Pareto frontier (qualifying)",
            zorder=2,
        )
        texts = [
            (
                r.output_throughput_tok_s,
                r.per_request_tok_s,
                f"{r.split.replace(' ', '')} {load_text(r._asdict(), lc)}",
            )
            for r in front.itertuples()
        ]
        _annotate_apart(ax, texts, fontsize=7)
    w = result.winner
    if all(
        f"{c}_{e}" in w.index for c in ("output_throughput_tok_s", "per_request_tok_s") for e in ("lo", "hi")
    ):
        # the winner's likely band on both axes: a runner-up inside it is not surely behind
        x, y = w.output_throughput_tok_s, w.per_request_tok_s
        ax.errorbar(
            [x],
            [y],
            xerr=[[x - w.output_throughput_tok_s_lo], [w.output_throughput_tok_s_hi - x]],
            yerr=[[y - w.per_request_tok_s_lo], [w.per_request_tok_s_hi - y]],
            fmt="none",
            ecolor="goldenrod",
            elinewidth=1.2,
            capsize=4,
            zorder=3,
            label="the best point's likely band (80%; cut at the axes)",
        )
    ax.scatter(
        [w.output_throughput_tok_s],
        [w.per_request_tok_s],
        marker="*",
        s=260,
        color="gold",
        edgecolors="black",
        zorder=4,
        label=f"best ({result.objective}): {w.split} at {load_text(w, lc)}",
    )
    for k, v in result.constraints.items():
        col, at_most, text = CONSTRAINTS[k]
        if col == "per_request_tok_s":
            ax.axhline(v, color="grey", linestyle="--", linewidth=1)
            ax.annotate(
                text.format(v),
                (0.99, v),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="bottom",
                fontsize=7,
                color="dimgrey",
            )
        elif col.startswith("tpot"):
            # a request's decode speed is 1000 / its mean TPOT: the limit as a speed (approximate for a percentile)
            ax.axhline(1000.0 / v, color="grey", linestyle=":", linewidth=1)
            ax.annotate(
                f"{text.format(v)} (about {1000.0 / v:,.0f} tok/s per request)",
                (0.01, 1000.0 / v),
                xycoords=("axes fraction", "data"),
                ha="left",
                va="bottom",
                fontsize=7,
                color="dimgrey",
            )
    ax.set_xlabel("output throughput (tok/s, whole engine)")
    ax.set_ylabel("per-request decode speed (tok/s)")
    # the axes span the points, not the band (up to x3.8 either way: it would squeeze them)
    for lim, top in (
        (ax.set_xlim, df.output_throughput_tok_s.max()),
        (ax.set_ylim, df.per_request_tok_s.max()),
    ):
        if math.isfinite(top) and top > 0:  # a column of figures not defined (one-token outputs): as drawn
            lim(0, 1.12 * float(top))
    ax.grid(True, alpha=0.3)
    # beside the axes: inside, it hid the frontier's labels (its top points sit upper right)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def breakdown(df: pd.DataFrame) -> Figure:
    """Where each split's GPU time goes at each concurrency: compute, all-reduce, and
    idle time by what it waited for (P2P hop, CPU, or the pipeline bubble)."""
    missing = [c for c, _, _ in SHARES if c not in df.columns]
    require(
        not missing, f"the sweep table has no {', '.join(missing)}; rerun it with this version of pipesim"
    )
    parts = list(_splits(df))
    cols = min(4, len(parts))
    rows = math.ceil(len(parts) / cols)
    fig = _figure(3.2 * cols + 0.6, 3.4 * rows + 1.2)
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False).ravel()
    for ax, (label, part) in zip(axes, parts):
        x = range(len(part))
        bottom = [0.0] * len(part)
        for col, name, color in SHARES:
            vals = (part[col].clip(lower=0) * 100).tolist()
            ax.bar(x, vals, bottom=bottom, color=color, label=name, width=0.75)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(list(x), [str(c) for c in part.conc], fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("concurrency C")
        ax.set_ylim(0, 100)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes[len(parts) :]:
        ax.set_visible(False)
    for ax in axes[::cols]:
        ax.set_ylabel("share of GPU time (%)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    fig.suptitle(
        f"Where the GPU time goes, per split (mean over stages, measurement window)\n{_subtitle(df)}",
        fontsize=10,
    )
    return fig


def compare(
    variants: dict[str, pd.DataFrame],
    column: str = "output_throughput_tok_s",
    ylabel: str = "best output throughput (tok/s, whole engine)",
) -> Figure:
    """What-ifs side by side: for each variant the best split's `column` at each
    concurrency. The first variant's best split is named at each point, another's only
    where it differs (equal curves draw over each other: the markers tell them apart)."""
    from .sweep import best_by_conc

    variants = {
        name + (f" [{condition_text(c)}]" if c else ""): part
        for name, df in variants.items()
        for c, part in conditions(df)
    }
    fig = _figure()
    ax = fig.add_subplot()
    markers = "osD^vPX*"
    concs, reference = [], None
    for i, (name, df) in enumerate(variants.items()):
        best = best_by_conc(df, column)
        concs += best.conc.tolist()
        (line,) = ax.plot(
            best.conc,
            best[column],
            marker=markers[i % len(markers)],
            markersize=7 - 0.6 * (i % 5),
            label=name,
        )
        if reference is None:
            reference = dict(zip(best.conc, best.split))
        for r in best.itertuples():
            if i == 0 or reference.get(r.conc) != r.split:
                ax.annotate(
                    str(r.split).replace(" ", ""),
                    (r.conc, getattr(r, column)),
                    textcoords="offset points",
                    xytext=(5, -10),
                    fontsize=7,
                    color=line.get_color(),
                )
    _conc_axis(ax, concs)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="what-if", loc="upper left", fontsize=8)
    first = next(iter(variants))
    fig.suptitle(
        f"What-ifs: the best split at each concurrency (named for {first}, and where another differs)\n"
        f"{_subtitle(pd.concat(list(variants.values()), ignore_index=True))}",
        fontsize=10,
    )
    return fig


def save(fig: Figure, path: str | Path) -> Path:
    """Save a figure atomically as .png or .svg (by the suffix), making its folder if missing."""
    ensure_dir(Path(path).parent if str(Path(path).parent) else ".", "figure")
    out = check_out_path(path, (".png", ".svg"), "figure")
    fmt = out.suffix.lower()[1:]
    return write_atomic(out, lambda tmp: fig.savefig(tmp, format=fmt))


def save_all(
    df: pd.DataFrame,
    out_dir: str | Path = ".",
    fmt: str = "png",
    prefix: str = "",
    progress: bool | None = None,
) -> list[Path]:
    """The figures of a sweep as OUT_DIR/[PREFIX]NAME.FMT, NAME in FIGURES: throughput,
    per-GPU throughput, the trade-off, the time breakdown, the bubble's cause. A table
    of several conditions (box, engine, lengths: conditions.py) gets a set per condition,
    OUT_DIR/[PREFIX]NAME_CONDITION.FMT (e.g. throughput_engine-vllm.png), each titled
    with its condition: splits are compared within one. Written all or none, with a
    progress bar over the figures once they have taken two seconds (`progress` None:
    on a terminal)."""
    require(fmt in ("png", "svg"), f"unknown figure format '{fmt}'; allowed: png, svg")
    require(len(df) > 0, "the sweep table is empty")
    folder = ensure_dir(out_dir, "figure")
    makers = {
        "throughput": throughput,
        "per_gpu": per_gpu,
        "tradeoff": tradeoff,
        "breakdown": breakdown,
        "bubble_cause": bubble_cause,
    }
    # a table written before the slots by position, or of DP ranks alone: no bubble-cause
    # figure rather than none at all
    positions = "occupancy_by_position" in df.columns and df.occupancy_by_position.notna().any()
    names = [n for n in FIGURES if n != "bubble_cause" or positions]
    # one set of figures per condition (box, engine, lengths), its file named for it
    parts = list(conditions(df))
    jobs = [
        (name, part, f"{prefix}{name}" + (f"_{condition_slug(c)}" if c else "") + f".{fmt}")
        for c, part in parts
        for name in names
    ]
    # all figures or none: each is drawn to a temporary file first, then all are renamed into place
    paths = [check_out_path(folder / file, (".png", ".svg"), "figure") for _, _, file in jobs]

    with bar(len(jobs), "figures", progress, unit="figure", delay=2.0) as drawn:

        def draw(name: str, part: pd.DataFrame) -> Callable[[Path], None]:
            def save(tmp: Path) -> None:
                makers[name](part).savefig(tmp, format=fmt)
                drawn.update(1)

            return save

        return write_files([(path, draw(name, part)) for (name, part, _), path in zip(jobs, paths)])

"""What the figures of plot.py share: the subtitle and labels, the splits of a sweep
table in order, the concurrency axis, a blank figure, the running-cap marks, and a
label placer that keeps labels from printing over each other."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

if TYPE_CHECKING:
    from typing import TypeAlias

    from matplotlib.axes import Axes
    from matplotlib.transforms import Bbox
    from matplotlib.typing import ColorType

    # a point's label: (x, y, text), or (x, y, text, color)
    Label: TypeAlias = tuple[float, float, str] | tuple[float, float, str, ColorType]

ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


def _subtitle(df: pd.DataFrame) -> str:
    """Box, model and engine (and the workload and profile) of the sweep, two lines."""

    def names(col: str) -> str:
        return ", ".join(dict.fromkeys(ENGINE_NAMES.get(str(x), str(x)) for x in df[col]))

    return (
        f"{names('model')} with {names('engine')} on {names('box')}\n"
        f"{names('gpu')}; in/out {names('input_len')}/{names('output_len')} tokens; profile {names('profile')}"
    )


def _label(df: pd.DataFrame, gpus: int, split: str) -> str:
    return split if df.gpus.nunique() == 1 else f"{split} ({gpus} GPUs)"


def _splits(df: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """(label, rows) of each split, by GPUs, tp, pp and dp: keyed by the split's name, so
    a DP split with a plain split's tp and pp stays apart. A table of several conditions
    (box, engine, lengths: conditions.py) gives one per split and condition, labelled
    with the condition."""
    from .conditions import condition_index, condition_text, conditions

    order = ["gpus", "tp", "pp"] + (["dp"] if "dp" in df.columns else [])
    texts = [condition_text(c) for c, _ in conditions(df)]
    ranked = df.assign(_condition=condition_index(df)).sort_values(["_condition", *order, "conc"])
    for _, part in sorted(
        ranked.groupby(["_condition", "gpus", "split"], sort=False),
        key=lambda kv: tuple(kv[1].iloc[0][["_condition", *order]]),
    ):
        label = _label(df, int(part.gpus.iloc[0]), part.split.iloc[0])
        tag = f" [{texts[int(part._condition.iloc[0])]}]" if len(texts) > 1 else ""
        if tag not in label:  # a search across conditions names them in the split already
            label += tag
        yield label, part.drop(columns="_condition")


def _conc_axis(ax: Axes, concs: Iterable[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(sorted(set(int(c) for c in concs)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("concurrency C (requests in flight, log scale)")


def _figure(width: float = 8.0, height: float = 5.0) -> Figure:
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _mark_caps(
    ax: Axes, df: pd.DataFrame, column: str, scale: Callable[[pd.DataFrame], float] = lambda part: 1.0
) -> None:
    """Where the running cap or the KV cache flattens a split's curve: the first swept
    concurrency at or above the split's `effective_cap` (sweep.caps), labelled with the
    bound; past it more clients only queue. Needs the sweep table's cap columns."""
    if "effective_cap" not in df.columns:
        return
    texts: list[Label] = []
    for _label, part in _splits(df):
        cap = int(part.effective_cap.iloc[0])
        at = part[part.conc >= cap]
        if at.empty or cap <= int(part.conc.min()):
            continue
        r = at.iloc[0]
        reason = str(part.cap_reason.iloc[0])
        what = f"KV cache: {cap} requests" if reason == "KV cache" else f"{reason} {cap}"
        texts.append((r.conc, r[column] / scale(part), f"{part.split.iloc[0].replace(' ', '')}: {what}"))
    if texts:
        _annotate_apart(ax, texts, fontsize=7, color="dimgrey", arrows=True)


def _annotate_apart(
    ax: Axes, texts: Sequence[Label], fontsize: int = 7, color: ColorType | None = None, arrows: bool = False
) -> None:
    """Label points so that labels do not print over each other: each label goes to the
    first of a ring of offsets where its drawn box overlaps no label placed before it
    (measured with the Agg renderer at the figure's size)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    assert isinstance(fig, Figure)  # drawn on a figure of _figure, never a subfigure
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw_without_rendering()  # lays the figure out, fixing the axes' transforms
    placed: list[Bbox] = []
    offsets = [
        (5, 4),
        (5, -12),
        (-5, 4),
        (-5, -12),
        (5, 14),
        (-5, 14),
        (5, -22),
        (-5, -22),
        (5, 24),
        (-5, 24),
    ]
    offsets += [(5, 34 + 10 * k) for k in range(20)]
    if arrows:  # labels set off below-right of the point, with an arrow to it
        offsets = [(12, -28 - 12 * k) for k in range(12)] + [(-12, -28 - 12 * k) for k in range(12)]
    for item in texts:
        x, y, text = item[:3]
        c = item[3] if len(item) > 3 else color
        for k, (dx, dy) in enumerate(offsets):
            note = ax.annotate(
                text,
                (x, y),
                textcoords="offset points",
                xytext=(dx, dy),
                ha="right" if dx < 0 else "left",
                fontsize=fontsize,
                color=c,
                arrowprops=dict(arrowstyle="->", color="grey", lw=0.7) if arrows else None,
            )
            box = note.get_window_extent(renderer)
            if (
                not any(box.overlaps(b) for b in placed) or k == len(offsets) - 1
            ):  # the last place if none is free
                placed.append(box)
                break
            note.remove()


def _undefined_speed(ax: Axes, df: pd.DataFrame) -> None:
    """Say on `ax` how many points have no per-request speed to place them by (one-token
    outputs: no request decodes; files.UNDEFINED_OK): they are not drawn."""
    missing = int(df.per_request_tok_s.isna().sum())
    if missing:
        ax.text(
            0.5,
            0.5,
            f"{missing} of {len(df)} points not drawn: per-request decode speed not defined\n"
            "(no measured request produced a second token)",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=9,
            color="dimgrey",
        )


def _band_note(df: pd.DataFrame) -> str:
    """What the points' likely bands span, for a figure that draws none (two axes of
    bands would hide the points): the widest factor on each axis."""
    cols = ("output_throughput_tok_s", "per_request_tok_s")
    if not all(f"{c}_hi" in df.columns for c in cols):
        return "no likely band in the table"
    x, y = ((df[f"{c}_hi"] / df[c]).max() for c in cols)
    return f"each point's likely band (80%): up to x{x:.1f} on throughput, x{y:.1f} on per-request speed, either way"

"""Figures of a sweep: what is drawn is the table's numbers, axes carry units, the
title names box, model and engine; files are PNG / SVG written atomically."""

import xml.etree.ElementTree as ET

import pandas as pd
import pytest
from matplotlib.patches import Rectangle

import pipesim
from pipesim.base.files import write_table
from pipesim.cli import main
from pipesim.explore import plot

SPLITS = [(8, 1), (4, 2), (1, 8)]
CONC = [1, 8, 32]


def table(model: str = "kimi-k2.6") -> pd.DataFrame:
    """A sweep table with made-up numbers whose GPU time shares add up to one."""
    rows = []
    for tp, pp in SPLITS:
        for c in CONC:
            bubble = 1 - 1 / pp if c < pp else 0.1
            allreduce = 0.05 * tp / 8 * 4
            rows.append(
                {
                    "box": "rtx-pro-6000-server-8x",
                    "gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                    "model": model,
                    "profile": "rtx-pro-6000-sglang-healthy",
                    "engine": "sglang",
                    "input_len": "256",
                    "output_len": "300",
                    "seed": 0,
                    "gpus": 8,
                    "tp": tp,
                    "pp": pp,
                    "conc": c,
                    "split": f"TP{tp} x PP{pp}",
                    "output_throughput_tok_s": 10.0 * c * tp + pp,
                    "output_throughput_ci_tok_s": 1.0,
                    "per_request_tok_s": 100.0 / c + tp,
                    "ttft_ms_p99": 100.0 * c,
                    "compute_share": 1 - bubble - allreduce,
                    "allreduce_share": allreduce,
                    "bubble_fraction": bubble,
                    "idle_p2p_share": 0.02 * bubble,
                    "idle_cpu_share": 0.01 * bubble,
                    "idle_bubble_share": 0.97 * bubble,
                    "sim_wall_s": 0.1,
                }
            )
    return pd.DataFrame(rows)


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


def test_throughput_figure():
    df = table()
    fig = plot.throughput(df)
    ax = fig.axes[0]
    lines = lines_by_label(ax)
    assert set(lines) == {"TP8 x PP1", "TP4 x PP2", "TP1 x PP8"}
    part = df[df.tp == 4]
    assert list(lines["TP4 x PP2"].get_xdata()) == CONC
    assert list(lines["TP4 x PP2"].get_ydata()) == part.output_throughput_tok_s.tolist()
    assert "concurrency" in ax.get_xlabel() and "tok/s" in ax.get_ylabel()
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["TP1 x PP8", "TP4 x PP2", "TP8 x PP1"]
    title = fig._suptitle.get_text()
    assert "kimi-k2.6" in title and "SGLang" in title and "rtx-pro-6000-server-8x" in title


def _shaded(ax) -> list:
    """The (y low, y high) at each x of every band fill_between drew, one list per fill."""
    import numpy as np

    out = []
    for poly in ax.collections:
        if not poly.get_paths():
            continue
        xy = poly.get_paths()[0].vertices
        xs = np.unique(xy[:, 0])
        out.append({x: (xy[xy[:, 0] == x, 1].min(), xy[xy[:, 0] == x, 1].max()) for x in xs})
    return out


@pytest.mark.parametrize("factor, log", [(1.2, False), (3.0, True)])
def test_throughput_figure_shades_the_likely_band(factor, log):
    """The shading is each split's likely band from the table's _lo / _hi columns (not
    the run's CI); bands wider than a factor of two go on a log scale, and the title says
    which it shows."""
    df = table()
    df = df.assign(
        output_throughput_tok_s_lo=df.output_throughput_tok_s / factor,
        output_throughput_tok_s_hi=df.output_throughput_tok_s * factor,
    )
    fig = plot.throughput(df)
    ax = fig.axes[0]
    part = df[df.tp == 4].set_index("conc")
    bands = _shaded(ax)
    assert len(bands) == len(SPLITS)
    got = next(b for b in bands if b[1][1] == pytest.approx(part.output_throughput_tok_s_hi[1]))
    for c in CONC:
        assert got[c] == pytest.approx(
            (part.output_throughput_tok_s_lo[c], part.output_throughput_tok_s_hi[c])
        )
    assert (ax.get_yscale() == "log") == log
    assert "likely band (80%" in fig._suptitle.get_text()
    # per GPU: the same band divided by the GPUs
    ax = plot.per_gpu(df).axes[0]
    assert any(
        b.get(1, (0, 0))[1] == pytest.approx(part.output_throughput_tok_s_hi[1] / 8) for b in _shaded(ax)
    )
    # a table without bands shades the run's CI and says so
    fig = plot.throughput(table())
    assert "95% CI" in fig._suptitle.get_text() and fig.axes[0].get_yscale() == "linear"


def test_tradeoff_figure():
    df = table()
    fig = plot.tradeoff(df)
    ax = fig.axes[0]
    line = lines_by_label(ax)["TP1 x PP8"]
    part = df[df.tp == 1]
    assert list(line.get_xdata()) == part.output_throughput_tok_s.tolist()
    assert list(line.get_ydata()) == part.per_request_tok_s.tolist()
    assert "tok/s" in ax.get_xlabel() and "tok/s" in ax.get_ylabel()
    # every point labelled with its concurrency
    assert sorted(int(t.get_text()) for t in ax.texts) == sorted(CONC * len(SPLITS))


def test_breakdown_stacks_to_the_whole_gpu_time():
    df = table()
    fig = plot.breakdown(df)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["TP1 x PP8", "TP4 x PP2", "TP8 x PP1"]
    for ax, (_, part) in zip(panels, df.sort_values(["tp", "conc"]).groupby("tp", sort=True)):
        bars = [p for p in ax.patches if isinstance(p, Rectangle)]
        assert len(bars) == len(CONC) * len(plot.SHARES)
        tops = {}
        for b in bars:
            x = round(b.get_x() + b.get_width() / 2)
            tops[x] = tops.get(x, 0) + b.get_height()
        assert list(tops.values()) == pytest.approx([100.0] * len(CONC))
        # the bubble layer is the table's bubble share
        bubble = [b.get_height() for b in bars[-len(CONC) :]]
        assert bubble == pytest.approx((part.idle_bubble_share * 100).tolist())
        assert "%" in panels[0].get_ylabel()
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [name for _, name, _ in plot.SHARES]


def test_compare_draws_the_best_split_of_each_variant():
    a, b = table(), table()
    b["output_throughput_tok_s"] *= 2
    fig = plot.compare({"baseline": a, "twice": b})
    lines = lines_by_label(fig.axes[0])
    assert set(lines) == {"baseline", "twice"}
    best = a.groupby("conc").output_throughput_tok_s.max().tolist()
    assert list(lines["baseline"].get_ydata()) == best
    assert list(lines["twice"].get_ydata()) == [2 * v for v in best]


def test_save_all_png_and_svg(tmp_path):
    df = capped()
    pngs = plot.save_all(df, tmp_path, "png")
    svgs = plot.save_all(df, tmp_path, "svg", prefix="k-")
    assert [p.name for p in pngs] == [f"{name}.png" for name in plot.FIGURES]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    for p in svgs:
        assert p.name.startswith("k-") and ET.parse(p).getroot().tag.endswith("svg")
    assert len(list(tmp_path.iterdir())) == 2 * len(plot.FIGURES)  # no temporary files left


def test_save_all_makes_the_folder_and_its_parents(tmp_path):
    """A fresh run: `pipesim plot results.csv --out-dir figures` must not need the folder."""
    paths = plot.save_all(table(), tmp_path / "new" / "figures")
    assert [p.parent for p in paths] == [tmp_path / "new" / "figures"] * len(paths)
    assert all(p.is_file() for p in paths)


@pytest.mark.parametrize(
    "call, needle",
    [
        (
            lambda tmp: (tmp / "f").write_text("") or plot.save_all(table(), tmp / "f" / "figs"),
            "f' is a file, not a folder",
        ),
        (lambda tmp: plot.save_all(table(), tmp, "jpg"), "unknown figure format 'jpg'"),
        (lambda tmp: plot.save(plot.throughput(table()), tmp / "x.pdf"), "must end in .png or .svg"),
        (lambda tmp: plot.breakdown(table().drop(columns=["idle_cpu_share"])), "no idle_cpu_share"),
    ],
)
def test_bad_input(tmp_path, call, needle):
    with pytest.raises(pipesim.UserError) as exc:
        call(tmp_path)
    assert needle in str(exc.value)


def test_cli_plot_from_a_real_sweep(tmp_path, capsys, profile):
    df = pipesim.sweep(8, [1, 4], profile=profile, workers=1, input_len="64", output_len="20")
    write_table(df, tmp_path / "r.csv")
    main(["plot", str(tmp_path / "r.csv"), "--out-dir", str(tmp_path), "--format", "svg"])
    assert capsys.readouterr().out.count("wrote") == len(plot.FIGURES)
    assert sorted(p.name for p in tmp_path.glob("*.svg")) == sorted(f"{n}.svg" for n in plot.FIGURES)


def test_cli_plot_bad_input(tmp_path, capsys):
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    write_table(table(), tmp_path / "r.csv")
    for args, needle in [
        ([str(tmp_path / "nope.csv")], "does not exist"),
        ([str(tmp_path / "other.csv")], "not a pipesim sweep table"),
        ([str(tmp_path / "r.csv"), "--format", "gif"], "unknown figure format 'gif'"),
        (
            [str(tmp_path / "r.csv"), "--out-dir", str(tmp_path / "r.csv" / "figs")],
            "r.csv' is a file, not a folder",
        ),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(["plot", *args])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err


# ---- per-GPU view, caps, the bubble's cause, labels that do not overprint ------------------


def capped(reason: str = "running cap", cap: int = 8) -> pd.DataFrame:
    """The table with its caps and made-up slots by position: C requests spread evenly
    over the first min(C, slots) positions, the others empty all the time."""
    df = table()
    slots = df.pp.where(df.pp > 1, 1)
    busy = [min(c, p) for c, p in zip(df.conc, slots)]
    means = [
        ";".join(f"{c / b if k < b else 0.0:.3f}" for k in range(p)) for c, p, b in zip(df.conc, slots, busy)
    ]
    empty = [";".join("0.0000" if k < b else "1.0000" for k in range(p)) for p, b in zip(slots, busy)]
    return df.assign(
        effective_cap=cap,
        cap_reason=reason,
        slot_cap=8 // df.pp,
        slots=slots,
        occupancy_by_position=means,
        empty_share_by_position=empty,
    )


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def test_per_gpu_figure_divides_by_the_gpus():
    df = table()
    ax = plot.per_gpu(df).axes[0]
    line = lines_by_label(ax)["TP4 x PP2"]
    assert list(line.get_ydata()) == (df[df.tp == 4].output_throughput_tok_s / 8).tolist()
    assert "per GPU" in ax.get_ylabel()


@pytest.mark.parametrize(
    "reason, label", [("running cap", "running cap 8"), ("KV cache", "KV cache: 8 requests")]
)
def test_caps_are_marked_where_the_curve_flattens(reason, label):
    """With a cap of 8 running requests, C=8 is the first swept load at the cap: each
    split's label points there (at C=8 and its throughput)."""
    df = capped(reason)
    ax = plot.throughput(df).axes[0]
    notes = [t for t in ax.texts if label in t.get_text()]
    assert len(notes) == 3
    for t in notes:
        split = t.get_text().split(":")[0]
        row = df[(df.split.str.replace(" ", "") == split) & (df.conc == 8)].iloc[0]
        assert tuple(t.xy) == (8, row.output_throughput_tok_s)


def test_no_cap_marks_without_the_cap_columns():
    assert not plot.throughput(table()).axes[0].texts


def test_bubble_cause_draws_each_position_of_each_pp_split():
    """Per PP split, the positions' mean requests (top) and time empty (bottom) as the
    table has them; positions that read the same at every load are one line (PP8's 2nd
    to 8th: 0, 1 and 4 requests at C = 1, 8, 32); a row without positions (a DP rank's,
    or a table's from before them) is left out."""
    df = capped()
    gone = (df.pp == 2) & (df.conc == 32)
    df.loc[gone, ["occupancy_by_position", "empty_share_by_position"]] = float("nan")
    fig = plot.bubble_cause(df)
    # one row of two panels: the tops, then the bottoms
    pp8_top, pp2_top, pp8_bottom, pp2_bottom = [ax for ax in fig.axes if ax.get_visible()]
    assert [pp8_top.get_title(), pp2_top.get_title()] == [
        "TP1 x PP8 (8 slots)",
        "TP4 x PP2 (2 slots)",
    ]  # PP1: none
    assert [k for k in lines_by_label(pp8_top) if not k.startswith("_")] == ["1st", "2nd-8th"]  # and the cap
    assert list(lines_by_label(pp8_top)["2nd-8th"].get_ydata()) == [0.0, 1.0, 4.0]
    assert list(lines_by_label(pp8_bottom)["2nd-8th"].get_ydata()) == [100.0, 0.0, 0.0]
    part = df[(df.pp == 2) & ~gone]
    for k, name in enumerate(["1st", "2nd"]):
        top, bottom = lines_by_label(pp2_top)[name], lines_by_label(pp2_bottom)[name]
        assert list(top.get_xdata()) == list(bottom.get_xdata()) == [1, 8]
        assert list(top.get_ydata()) == [float(v.split(";")[k]) for v in part.occupancy_by_position]
        assert list(bottom.get_ydata()) == [
            100 * float(v.split(";")[k]) for v in part.empty_share_by_position
        ]
    assert any("per-slot cap 4" in t for t in texts(pp2_top))
    assert "time empty" in pp2_bottom.get_ylabel() and "requests" in pp2_top.get_ylabel()


def test_bubble_cause_needs_positions():
    with pytest.raises(pipesim.UserError, match="no occupancy_by_position"):
        plot.bubble_cause(table())
    dp_only = capped().assign(occupancy_by_position=float("nan"), empty_share_by_position=float("nan"))
    with pytest.raises(pipesim.UserError, match="DP ranks have none"):
        plot.bubble_cause(dp_only)


def _overlaps(fig) -> list[tuple[str, str]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(r)) for ax in fig.axes for t in ax.texts if t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1 :] if ba.overlaps(bb)]


def test_labels_do_not_print_over_each_other():
    """Point labels of the trade-off figure and cap labels of the throughput figure:
    no two text boxes overlap once drawn."""
    df = capped()
    for fig in (plot.tradeoff(df), plot.throughput(df), plot.per_gpu(df)):
        assert _overlaps(fig) == []


def test_save_all_writes_every_figure(tmp_path):
    paths = plot.save_all(capped(), tmp_path)
    assert [p.stem for p in paths] == list(plot.FIGURES)

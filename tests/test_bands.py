"""A sweep's bands as a planner reads them (explore/bands.py): their width, and whether
a winner's margin is inside its band, worked by hand on a small table."""

import pandas as pd

from pipesim.explore.bands import band_of, footer, inside_count, margin_text, width_text


def _table() -> pd.DataFrame:
    # two loads, two splits; at C=8 the runner-up (90) is inside the best's band (80-125),
    # at C=64 it (100) is not (150-240)
    rows = [
        ("A", 8, 100.0, 80.0, 125.0),
        ("B", 8, 90.0, 72.0, 112.5),
        ("A", 64, 200.0, 150.0, 240.0),
        ("B", 64, 100.0, 80.0, 125.0),
    ]
    return pd.DataFrame(
        [
            {
                "split": s,
                "gpus": 8,
                "conc": c,
                "output_throughput_tok_s": v,
                "output_throughput_tok_s_lo": lo,
                "output_throughput_tok_s_hi": hi,
            }
            for s, c, v, lo, hi in rows
        ]
    )


def test_band_of_a_row_and_of_a_row_without_one():
    df = _table()
    assert band_of(df.iloc[0], "output_throughput_tok_s") == (80.0, 125.0)
    assert band_of(df.iloc[0], "per_request_tok_s") is None
    assert band_of({"x": 1.0, "x_lo": float("nan"), "x_hi": 2.0}, "x") is None


def test_margin_inside_or_outside_the_winners_band():
    df = _table()
    assert "inside the winner's likely band (80.0-125.0)" in margin_text(
        df.iloc[0], df.iloc[1], "output_throughput_tok_s"
    )
    assert "outside the winner's likely band (150.0-240.0)" in margin_text(
        df.iloc[2], df.iloc[3], "output_throughput_tok_s"
    )
    assert margin_text({"x": 1.0}, {"x": 0.5}, "x") == ""


def test_width_and_how_often_the_star_is_inside_the_band():
    df = _table()
    # the widest factors: 100 / 72 ... 90 / 72 = 1.25 below, 125 / 100 = 1.25 above; 150 / 200 -> /1.33
    assert "/1.33 and x1.25" in width_text(df)
    assert inside_count(df, ["gpus", "conc"]) == (1, 2)
    lines = footer(df, ["gpus", "conc"])
    assert len(lines) == 2 and "at 1 of 2 loads the runner-up lies inside the best's band" in lines[1]
    assert (
        footer(df.drop(columns=["output_throughput_tok_s_lo", "output_throughput_tok_s_hi"]), ["conc"]) == []
    )


def test_the_sweep_summary_ends_with_its_bands():
    from pipesim.explore.sweep import summary

    df = _table().assign(
        tp=lambda d: d.split.map({"A": 8, "B": 4}),
        pp=lambda d: d.split.map({"A": 1, "B": 2}),
        dp=1,
        per_request_tok_s=10.0,
        model="m",
        box="b",
        profile="p",
        engine="sglang",
        input_len="256",
        output_len="300",
    )
    text = summary(df)
    assert text.splitlines()[-2].startswith("likely (80%) bands:")
    assert "within /1.33 and x1.25" in text.splitlines()[-2]

"""Search: the winner is the best qualifying point, the lowest concurrency that is as
good, objectives and constraints, the reasons given, bad input as one line."""

import pandas as pd
import pytest
from conftest import SMALL_SWEEP as SMALL

import pipesim
from pipesim.explore.search import search


def sweep_row(tp, pp, conc, tok, **cols) -> dict:
    """A sweep table's row for split TP x PP at `conc` clients on a placeholder box, GPU,
    model and profile (SGLang): `tok` output tok/s with no interval, then `cols`."""
    return dict(
        box="b",
        gpu="g",
        model="m",
        profile="p",
        engine="sglang",
        gpus=tp * pp,
        tp=tp,
        pp=pp,
        conc=conc,
        split=f"TP{tp} x PP{pp}",
        output_throughput_tok_s=tok,
        output_throughput_ci_tok_s=0.0,
        output_tok_s_per_gpu=tok / (tp * pp),
        **cols,
    )


def synthetic(rows) -> pd.DataFrame:
    """A sweep table from (tp, pp, conc, output tok/s, ttft ms, compute, all-reduce, bubble)."""
    return pd.DataFrame(
        [
            sweep_row(
                tp,
                pp,
                c,
                tok,
                per_request_tok_s=1000 / c,
                ttft_ms_p99=ttft,
                compute_share=cs,
                allreduce_share=ar,
                bubble_fraction=bu,
            )
            for tp, pp, c, tok, ttft, cs, ar, bu in rows
        ]
    )


# ---- search -------------------------------------------------------------------------------


def test_search_winner_is_the_best_qualifying_point(serial):
    res = search(table=serial, objective="throughput", min_per_request_tok_s=30)
    ok = serial[serial.per_request_tok_s >= 30]
    assert res.qualifying == len(ok)
    best = ok.output_throughput_tok_s.max()
    noise = max(ok.output_throughput_ci_tok_s.max(), 1e-9 * best)
    assert res.winner.output_throughput_tok_s >= best - noise
    # one row per split, best first, each its split's best qualifying point
    assert len(res.ranked) == ok[["tp", "pp"]].drop_duplicates().shape[0]
    assert res.ranked.output_throughput_tok_s.is_monotonic_decreasing
    for r in res.ranked.itertuples():
        mine = ok[(ok.tp == r.tp) & (ok.pp == r.pp)]
        assert r.output_throughput_tok_s >= mine.output_throughput_tok_s.max() - noise
    text = res.text()
    assert f"best: {res.winner.split}" in text and "per-request >= 30 tok/s" in text
    for word in ("compute", "all-reduce", "bubble", "GPU time per output token", res.ranked.split.iloc[1]):
        assert word in res.why


def test_search_prefers_the_lowest_concurrency_that_is_as_good():
    """A cap on running requests makes C=128 give what C=64 gives, with a longer queue:
    the winner is C=64, and the reason says the extra requests only queue."""
    df = synthetic(
        [
            (8, 1, 64, 800.0, 3000.0, 0.5, 0.3, 0.2),
            (8, 1, 128, 800.0, 24000.0, 0.5, 0.3, 0.2),
            (4, 2, 64, 600.0, 2500.0, 0.4, 0.1, 0.5),
            (4, 2, 128, 700.0, 5000.0, 0.45, 0.1, 0.45),
        ]
    )
    res = search(table=df, objective="throughput")
    assert (res.winner.split, res.winner.conc) == ("TP8 x PP1", 64)
    assert list(res.ranked.conc) == [64, 128]
    assert "C=128 gives 800.0, no more" in res.why and "only queue" in res.why
    # GPU time per token, 8 GPUs at 800 tok/s = 10 ms: 5 compute + 3 all-reduce + 2 idle;
    # the runner-up, 8000 / 700 = 11.43 ms: 5.14 + 1.14 + 5.14
    assert "winner 10.00 ms = compute 5.00 + all-reduce 3.00 + idle (bubble) 2.00" in res.why
    assert "runner-up 11.43 ms" in res.why
    assert "3.14 ms less idle (bubble), 0.14 ms less compute, against 1.86 ms more all-reduce" in res.why
    # a constraint that excludes the higher concurrency is named as the reason
    capped = search(table=df, objective="throughput", max_ttft_p99_ms=4000)
    assert (capped.winner.split, capped.winner.conc) == ("TP8 x PP1", 64)
    assert capped.ranked.iloc[1].conc == 64


def test_search_objectives_and_constraints(serial):
    ttft = search(table=serial, objective="ttft")
    assert ttft.winner.ttft_ms_p99 == serial.ttft_ms_p99.min()
    res = search(table=serial, objective="per-request", max_ttft_p99_ms=serial.ttft_ms_p99.median())
    ok = serial[serial.ttft_ms_p99 <= serial.ttft_ms_p99.median()]
    assert res.winner.per_request_tok_s == ok.per_request_tok_s.max()
    assert (res.ranked.ttft_ms_p99 <= serial.ttft_ms_p99.median()).all()


def test_search_explains_a_bubble_bound_loser(serial):
    """Kimi on PCIe: TP1 x PP8 idles most of its GPU time; if it is not the winner the
    reason names the bubble."""
    res = search(table=serial[serial.pp.isin([8, 4])], objective="throughput")
    w, r = res.ranked.iloc[0], res.ranked.iloc[1]
    assert w.bubble_fraction < r.bubble_fraction
    assert "idle" in res.why and f"{w.bubble_fraction:.0%} vs {r.bubble_fraction:.0%}" in res.why


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(objective="fastest"), "unknown objective 'fastest'; allowed: throughput"),
        (dict(min_per_request_tok_s=1e6), "no split and concurrency meets per-request >= 1e+06 tok/s"),
        (dict(max_ttft_p99_ms=-1.0), "max_ttft_p99_ms must be a number >= 0"),
    ],
)
def test_search_bad_input(serial, kwargs, needle):
    with pytest.raises(pipesim.UserError) as exc:
        search(table=serial, **kwargs)
    assert needle in str(exc.value)


def test_search_runs_a_sweep(profile):
    res = pipesim.search(
        gpus=8, objective="throughput", conc=[4], profile=profile, workers=1, model="llama-3.1-70b", **SMALL
    )
    assert len(res.ranked) == 4 and res.winner.model == "llama-3.1-70b"


# ---- SLO constraints, max-load, splits, intervals, the Pareto figure -------------------------


def slo_table(rows, rate=False) -> pd.DataFrame:
    """(tp, pp, load, tok/s, ttft p99, tpot p99[, overloaded]) -> a sweep table."""
    out = []
    for r in rows:
        tp, pp, load, tok, ttft, tpot = r[:6]
        out.append(
            sweep_row(
                tp,
                pp,
                0 if rate else load,
                tok,
                rate_rps=float(load) if rate else 0.0,
                per_request_tok_s=1000 / tpot,
                ttft_ms_p50=ttft / 2,
                ttft_ms_p99=ttft,
                tpot_ms_p50=tpot * 0.9,
                tpot_ms_p99=tpot,
                compute_share=0.5,
                allreduce_share=0.2,
                bubble_fraction=0.3,
                overloaded=r[6] if len(r) > 6 else False,
                served_req_s=float(load),
            )
        )
    return pd.DataFrame(out)


def test_max_load_is_the_largest_load_carried_with_every_smaller_one():
    """TP4 x PP2 meets TPOT p99 <= 50 at C=1, 2 and 8 but not 4: it carries C=2 (a load
    it passes above one it fails is not carried). TP8 x PP1 carries C=4. TP1 x PP8
    misses at C=1 already and is listed as carrying none."""
    df = slo_table(
        [
            (4, 2, 1, 100, 50, 30),
            (4, 2, 2, 180, 60, 40),
            (4, 2, 4, 300, 80, 60),
            (4, 2, 8, 500, 90, 45),
            (8, 1, 1, 120, 40, 20),
            (8, 1, 2, 220, 45, 30),
            (8, 1, 4, 400, 50, 40),
            (8, 1, 8, 700, 60, 55),
            (1, 8, 1, 30, 90, 70),
            (1, 8, 2, 50, 95, 80),
        ]
    )
    res = search(table=df, objective="max-load", max_tpot_p99_ms=50)
    assert [(r.split, r.conc) for r in res.ranked.itertuples()] == [("TP8 x PP1", 4), ("TP4 x PP2", 2)]
    assert "the next load swept, C=8: TPOT p99 55.0 ms (needs TPOT p99 <= 50 ms)" in res.why
    assert "TP4 x PP2 carries C=2" in res.why and "C=4: TPOT p99 60.0 ms" in res.why
    assert res.unqualified == (
        "TP1 x PP8 carries none of the swept loads: at C=1 it misses TPOT p99 70.0 ms "
        "(needs TPOT p99 <= 50 ms)",
    )
    assert "TP1 x PP8 carries none" in res.text()


def test_max_load_by_rate_never_counts_an_overloaded_point():
    """Open loop: a rate whose queue grows does not qualify, whatever its latencies say."""
    df = slo_table(
        [
            (8, 1, 1.0, 300, 200, 30),
            (8, 1, 2.0, 600, 300, 35),
            (8, 1, 3.0, 700, 400, 38, True),
            (4, 2, 1.0, 300, 300, 40),
            (4, 2, 2.0, 450, 40000, 45, True),
        ],
        rate=True,
    )
    res = search(table=df, objective="max-load", max_tpot_p99_ms=50)
    assert [(r.split, r.rate_rps) for r in res.ranked.itertuples()] == [
        ("TP8 x PP1", 2.0),
        ("TP4 x PP2", 1.0),
    ]
    assert "overloaded" in res.why and "2 req/s" in res.text()
    assert "not overloaded" in res.text().splitlines()[1]


def test_every_constraint_filters_its_column(serial):
    limits = dict(
        max_ttft_p50_ms=serial.ttft_ms_p50.median(),
        max_tpot_p50_ms=serial.tpot_ms_p50.quantile(0.7),
        max_tpot_p99_ms=serial.tpot_ms_p99.quantile(0.8),
        min_per_request_tok_s=10.0,
    )
    res = search(table=serial, objective="throughput", **limits)
    ok = serial[
        (serial.ttft_ms_p50 <= limits["max_ttft_p50_ms"])
        & (serial.tpot_ms_p50 <= limits["max_tpot_p50_ms"])
        & (serial.tpot_ms_p99 <= limits["max_tpot_p99_ms"])
        & (serial.per_request_tok_s >= 10.0)
    ]
    assert res.qualifying == len(ok) and 0 < len(ok) < len(serial)
    for r in res.ranked.itertuples():
        assert r.ttft_ms_p50 <= limits["max_ttft_p50_ms"] and r.tpot_ms_p99 <= limits["max_tpot_p99_ms"]
    assert "TPOT p50 <=" in res.text() and "TTFT p50 <=" in res.text()


def test_fewest_gpus_then_the_most_headroom():
    df = slo_table(
        [(4, 1, 2.0, 600, 1500, 40), (8, 1, 2.0, 600, 300, 20), (2, 2, 2.0, 600, 900, 45)], rate=True
    )
    res = search(table=df, objective="fewest-gpus", max_ttft_p99_ms=2000)
    assert [r.split for r in res.ranked.itertuples()] == ["TP2 x PP2", "TP4 x PP1", "TP8 x PP1"]
    assert "as many as the runner-up TP4 x PP1, with the lower TTFT p99 (900 ms against 1,500 ms)" in res.why


def test_splits_limit_the_search(serial):
    res = search(table=serial, objective="throughput", splits=[(2, 4), (8, 1)])
    assert set(res.ranked.split) == {"TP2 x PP4", "TP8 x PP1"}
    with pytest.raises(pipesim.UserError, match="none of the splits 3x3 is in the table"):
        search(table=serial, splits=[(3, 3)])


def test_the_answer_shows_an_interval_where_the_table_has_one(serial):
    df = serial.assign(
        output_throughput_tok_s_lo=serial.output_throughput_tok_s * 0.9,
        output_throughput_tok_s_hi=serial.output_throughput_tok_s * 1.2,
    )
    res = search(table=df, objective="throughput")
    w, text = res.winner, res.text()
    lo, hi = w.output_throughput_tok_s * 0.9, w.output_throughput_tok_s * 1.2
    fmt = "{:,.0f}" if hi >= 100 else "{:,.1f}"
    assert f"{w.output_throughput_tok_s:,.1f} (likely {fmt.format(lo)}-{fmt.format(hi)}) output tok/s" in text
    # every ranked split with its band, and whether the winner's margin is inside it
    assert text.count(f"{lo:,.0f}-{hi:,.0f}") >= 2 and " likely " in text.splitlines()[5]
    runner = res.ranked.iloc[1].output_throughput_tok_s
    inside = lo <= runner <= hi
    assert ("That margin is inside the winner's likely band" in res.why) == inside
    assert ("The runner-up lies outside the winner's likely band" in res.why) == (not inside)
    # a band narrow enough that the runner-up falls outside it says so
    narrow = df.copy()
    narrow.loc[w.name, "output_throughput_tok_s_lo"] = (w.output_throughput_tok_s + runner) / 2
    tight = search(table=narrow, objective="throughput")
    assert tight.winner.name == w.name and "The runner-up lies outside the winner's likely band" in tight.why


def test_search_json_is_strict_and_says_what_the_text_says(serial, tmp_path, capsys):
    import json

    from pipesim.base.files import write_table
    from pipesim.cli import main

    path = tmp_path / "t.csv"
    write_table(serial.assign(tpot_ms_p99=float("nan")), path)  # a figure that is not a number
    main(["search", "--from", str(path), "--json"])
    out = capsys.readouterr().out

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    data = json.loads(out, parse_constant=refuse)
    res = search(table=serial, objective="throughput")
    assert data["best"]["split"] == res.winner.split and data["why"] == res.why
    assert [r["split"] for r in data["ranked"]] == list(res.ranked.split)
    assert data["best"]["tpot_ms_p99"] is None


def test_pareto_frontier_by_hand():
    from pipesim.explore.plot import pareto_frontier

    x = [1, 2, 3, 4, 2.5]
    y = [9, 8, 5, 1, 4]  # (2.5, 4) is beaten by (3, 5) on both axes
    assert pareto_frontier(x, y) == [0, 1, 2, 3]
    assert pareto_frontier([1, 1], [2, 3]) == [1]


def test_pareto_figure_draws_frontier_and_limits(serial, tmp_path):
    from pipesim.explore import plot

    res = search(table=serial, objective="throughput", min_per_request_tok_s=20, max_tpot_p99_ms=60)
    fig = plot.pareto(res)
    ax = fig.axes[0]
    # the per-request limit as a line at 20 tok/s, the TPOT one at 1000 / 60 tok/s
    levels = sorted(round(line.get_ydata()[0], 3) for line in ax.lines if len(set(line.get_ydata())) == 1)
    assert 20.0 in levels and round(1000 / 60, 3) in levels
    out = plot.save(fig, tmp_path / "new" / "deeper" / "pareto.png")
    assert out.is_file() and out.stat().st_size > 10_000


def test_pareto_figure_draws_the_winners_band_and_keeps_the_legend_off_the_points(serial):
    from matplotlib.container import ErrorbarContainer

    from pipesim.explore import plot

    res = search(table=serial, objective="throughput")
    w = res.winner
    if "output_throughput_tok_s_lo" not in w.index:
        pytest.skip("the table carries no bands")
    ax = plot.pareto(res).axes[0]
    [bars] = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    xseg, yseg = (col.get_segments()[0] for col in bars.lines[2])
    assert sorted(p[0] for p in xseg) == pytest.approx(
        [w.output_throughput_tok_s_lo, w.output_throughput_tok_s_hi]
    )
    assert sorted(p[1] for p in yseg) == pytest.approx([w.per_request_tok_s_lo, w.per_request_tok_s_hi])
    # the axes span the points (the band may run past them), the legend sits beside the axes
    assert ax.get_xlim()[1] == pytest.approx(1.12 * serial.output_throughput_tok_s.max())
    assert ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted()).x0 > 1.0

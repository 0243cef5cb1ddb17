"""Search: the winner is the best qualifying point, the lowest concurrency that is as
good, objectives and constraints, the reasons given, bad input as one line."""

import pandas as pd
import pytest

import pipesim
from conftest import SMALL_SWEEP as SMALL
from pipesim.search import search


def synthetic(rows) -> pd.DataFrame:
    """A sweep table from (tp, pp, conc, output tok/s, ttft ms, compute, all-reduce, bubble)."""
    return pd.DataFrame([dict(box="b", gpu="g", model="m", profile="p", engine="sglang", gpus=tp * pp, tp=tp, pp=pp,
                              conc=c, split=f"TP{tp} x PP{pp}", output_throughput_tok_s=tok,
                              output_throughput_ci_tok_s=0.0, output_tok_s_per_gpu=tok / (tp * pp),
                              per_request_tok_s=1000 / c, ttft_ms_p99=ttft, compute_share=cs, allreduce_share=ar,
                              bubble_fraction=bu)
                         for tp, pp, c, tok, ttft, cs, ar, bu in rows])


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
    df = synthetic([(8, 1, 64, 800.0, 3000.0, 0.5, 0.3, 0.2), (8, 1, 128, 800.0, 24000.0, 0.5, 0.3, 0.2),
                    (4, 2, 64, 600.0, 2500.0, 0.4, 0.1, 0.5), (4, 2, 128, 700.0, 5000.0, 0.45, 0.1, 0.45)])
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


@pytest.mark.parametrize("kwargs, needle", [
    (dict(objective="fastest"), "unknown objective 'fastest'; allowed: throughput"),
    (dict(min_per_request_tok_s=1e6), "no split and concurrency meets per-request >= 1e+06 tok/s"),
    (dict(max_ttft_p99_ms=-1.0), "max_ttft_p99_ms must be a number >= 0"),
])
def test_search_bad_input(serial, kwargs, needle):
    with pytest.raises(pipesim.UserError) as exc:
        search(table=serial, **kwargs)
    assert needle in str(exc.value)


def test_search_runs_a_sweep(profile):
    res = pipesim.search(gpus=8, objective="throughput", conc=[4], profile=profile, workers=1,
                         model="llama-3.1-70b", **SMALL)
    assert len(res.ranked) == 4 and res.winner.model == "llama-3.1-70b"

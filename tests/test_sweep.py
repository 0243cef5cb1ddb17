"""Sweeps and search: every valid split, the same table however it runs (serial,
local processes, a Dask cluster), skipped splits named, the search's winner and
its reasons, and bad input as one line with exit code 2."""

import dataclasses
import sys

import pandas as pd
import pytest

import pipesim
from pipesim.cli import main
from pipesim.sweep import (WALL_COLUMNS, best_by_conc, read_table, search, splits, sweep, write_table)

SMALL = dict(input_len="64", output_len="40")
CONC = [1, 8]


def deterministic(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=list(WALL_COLUMNS))


@pytest.fixture(scope="module")
def serial(profile):
    """Kimi on the 8 GPUs: four splits x two concurrencies, in this process."""
    return sweep(8, CONC, profile=profile, workers=1, **SMALL)


def test_splits_of_a_gpu_count():
    assert splits(8) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert splits(6) == [(6, 1), (3, 2), (2, 3), (1, 6)]
    assert splits(1) == [(1, 1)]


def test_sweep_table(serial):
    df = serial
    assert list(df[["tp", "pp", "conc"]].itertuples(index=False, name=None)) == \
        [(1, 8, 1), (1, 8, 8), (2, 4, 1), (2, 4, 8), (4, 2, 1), (4, 2, 8), (8, 1, 1), (8, 1, 8)]
    assert (df.gpus == 8).all() and (df.model == "kimi-k2.6").all() and (df.engine == "sglang").all()
    assert df.attrs["skipped"] == []
    assert (df.layers_per_stage[df.pp == 8] == "7,7,7,8,8,8,8,8").all()    # SGLang's split of 61 layers
    # GPU time: compute + all-reduce + idle = 1, idle split by cause
    total = df.compute_share + df.allreduce_share + df.bubble_fraction
    assert total.tolist() == pytest.approx([1.0] * len(df), abs=1e-9)
    idle = df.idle_p2p_share + df.idle_cpu_share + df.idle_bubble_share
    assert idle.tolist() == pytest.approx(df.bubble_fraction.tolist(), abs=1e-9)
    assert (df.allreduce_share[df.tp == 1] == 0).all() and (df.allreduce_share[df.tp > 1] > 0).all()
    assert df.output_tok_s_per_gpu.tolist() == pytest.approx((df.output_throughput_tok_s / 8).tolist())


def test_sweep_row_is_what_predict_says(serial, profile):
    r = pipesim.predict(tp=2, pp=4, conc=8, profile=profile, **SMALL)
    row = serial[(serial.tp == 2) & (serial.conc == 8)].iloc[0]
    assert row.output_throughput_tok_s == r.output_throughput_tok_s
    assert row.per_request_tok_s == r.per_request_tok_s and row.ttft_ms_p99 == r.ttft_ms_p99
    assert row.bubble_fraction == r.bubble_fraction and row.sim_events == r.sim_events


def test_local_processes_give_the_serial_table(serial, profile):
    parallel = sweep(8, list(reversed(CONC)), profile=profile, workers=2, **SMALL)
    pd.testing.assert_frame_equal(deterministic(parallel), deterministic(serial))


def test_dask_cluster_gives_the_local_table(profile):
    """Llama 3.1 8B on 2 GPUs: two splits (TP2, PP2) x two concurrencies, on a local
    Dask cluster of two worker processes and on local processes: the same table."""
    distributed = pytest.importorskip("distributed")
    args = dict(model="llama-3.1-8b", profile=profile, **SMALL)
    local = sweep(2, CONC, workers=2, **args)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        remote = sweep(2, CONC, scheduler=cluster.scheduler_address, **args)
    assert list(remote[["tp", "pp"]].drop_duplicates().itertuples(index=False, name=None)) == [(1, 2), (2, 1)]
    assert len(remote) == 4
    pd.testing.assert_frame_equal(deterministic(remote), deterministic(local))


def test_invalid_splits_are_skipped_with_the_reason(profile):
    df = sweep("2,8", [4], profile=profile, workers=1, **SMALL)
    assert sorted(set(df.gpus)) == [8]
    skipped = df.attrs["skipped"]
    assert len(skipped) == 2 and all("does not fit" in s for s in skipped)
    assert {s.split(" (")[0] for s in skipped} == {"TP2 x PP1", "TP1 x PP2"}


def test_several_gpu_counts(profile):
    df = sweep([1, 2], [2], model="llama-3.1-8b", profile=profile, workers=1, **SMALL)
    assert list(df[["gpus", "tp", "pp"]].itertuples(index=False, name=None)) == [(1, 1, 1), (2, 1, 2), (2, 2, 1)]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(gpus=4), "no valid TP x PP split for 4 GPUs"),
    (dict(conc=[]), "--conc is empty"),
    (dict(conc="1,x"), "--conc '1,x'"),
    (dict(gpus="0"), "--gpus: 0"),
    (dict(model="no-such-model"), "unknown model 'no-such-model'"),      # not about a split: said as is
    (dict(rate_rps=2.0), "takes no rate_rps"),
])
def test_sweep_bad_input(profile, kwargs, needle):
    args = dict(gpus=8, conc=[1], profile=profile, workers=1, **SMALL)
    args.update(kwargs)
    with pytest.raises(pipesim.UserError, match=None) as exc:
        sweep(**args)
    assert needle in str(exc.value)


def test_write_and_read_csv_and_parquet(serial, tmp_path):
    for name in ("r.csv", "r.parquet"):
        if name.endswith("parquet"):
            pytest.importorskip("pyarrow")
        write_table(serial, tmp_path / name)
        back = read_table(tmp_path / name)
        pd.testing.assert_frame_equal(back, serial, check_dtype=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.parquet"]     # no temporary files


def test_parquet_without_pyarrow_is_one_line(serial, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)      # import pyarrow -> ImportError
    with pytest.raises(pipesim.UserError, match="needs pyarrow"):
        write_table(serial, tmp_path / "r.parquet")
    assert not list(tmp_path.iterdir())


def test_best_by_conc(serial):
    best = best_by_conc(serial)
    assert best.conc.tolist() == CONC
    for row in best.itertuples():
        at = serial[serial.conc == row.conc]
        assert row.output_throughput_tok_s == at.output_throughput_tok_s.max()


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


def synthetic(rows) -> pd.DataFrame:
    """A sweep table from (tp, pp, conc, output tok/s, ttft ms, compute, all-reduce, bubble)."""
    return pd.DataFrame([dict(box="b", gpu="g", model="m", profile="p", engine="sglang", gpus=tp * pp, tp=tp, pp=pp,
                              conc=c, split=f"TP{tp} x PP{pp}", output_throughput_tok_s=tok,
                              output_throughput_ci_tok_s=0.0, output_tok_s_per_gpu=tok / (tp * pp),
                              per_request_tok_s=1000 / c, ttft_ms_p99=ttft, compute_share=cs, allreduce_share=ar,
                              bubble_fraction=bu)
                         for tp, pp, c, tok, ttft, cs, ar, bu in rows])


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


# ---- the command line ---------------------------------------------------------------------

def test_cli_sweep_writes_a_table_and_search_reads_it(tmp_path, capsys):
    out = tmp_path / "r.csv"
    main(["sweep", "--gpus", "8", "--conc", "1,8", "--input-len", "64", "--output-len", "40", "--workers", "2",
          "--out", str(out), "--progress"])
    cap = capsys.readouterr()
    assert "TP1 x PP8" in cap.out and "TP8 x PP1" in cap.out and "*" in cap.out
    assert "8 points in" in cap.out
    assert "8/8" in cap.err                                # the progress bar went to stderr
    df = read_table(out)
    assert len(df) == 8
    main(["search", "--from", str(out), "--objective", "throughput", "--max-ttft-p99-ms", "100000"])
    text = capsys.readouterr().out
    assert "best:" in text and "why:" in text and "ranked" in text


@pytest.mark.parametrize("args, needle", [
    (["sweep", "--gpus", "4"], "no valid TP x PP split for 4 GPUs"),
    (["sweep", "--conc", ""], "--conc is empty"),
    (["sweep", "--conc", "1,two"], "--conc '1,two'"),
    (["sweep", "--out", "/nonexistent-dir/r.csv"], "does not exist"),
    (["sweep", "--out", "r.xlsx"], "must end in .csv or .parquet"),
    (["sweep", "--seed", "x"], "'--seed': 'x' is not a valid integer"),
    (["sweep", "--max-running-requests", "many"], "'--max-running-requests': 'many' is not a valid integer"),
    (["search", "--objective", "fastest"], "unknown objective 'fastest'"),
    (["search", "--min-per-request-tok-s", "fast"], "--min-per-request-tok-s 'fast' is not a number"),
    (["search", "--from", "/nonexistent-dir/r.csv"], "does not exist"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main([*args, "--output-len", "20"] if args[0] == "sweep" else args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesim: error:") and err.count("\n") == 1 and needle in err


def test_profile_objects_travel_to_workers(profile):
    """A what-if profile (an object, not a name) reaches the worker processes."""
    cheap = dataclasses.replace(profile, params=dataclasses.replace(profile.params, allreduce_scale=0.25))
    base = sweep(8, [4], profile=profile, workers=1, **SMALL)
    what_if = sweep(8, [4], profile=cheap, workers=2, **SMALL)
    tp8 = lambda df: df[df.tp == 8].iloc[0]  # noqa: E731
    assert tp8(what_if).allreduce_share < tp8(base).allreduce_share
    assert (what_if.allreduce_share[what_if.tp == 1] == 0).all()

"""Sweeps: every valid split, the same table however it runs (serial, local processes,
a Dask cluster), skipped splits named, the summary's best split, bad input as one line."""

import dataclasses

import pandas as pd
import pytest
from conftest import SMALL_SWEEP as SMALL
from conftest import SMALL_SWEEP_CONC as CONC

import pipesim
from pipesim.explore.sweep import WALL_COLUMNS, best_by_conc, splits, sweep


def deterministic(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=list(WALL_COLUMNS))


def test_splits_of_a_gpu_count():
    assert splits(8) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert splits(6) == [(6, 1), (3, 2), (2, 3), (1, 6)]
    assert splits(1) == [(1, 1)]


def test_sweep_table(serial):
    df = serial
    assert list(df[["tp", "pp", "conc"]].itertuples(index=False, name=None)) == [
        (1, 8, 1),
        (1, 8, 8),
        (2, 4, 1),
        (2, 4, 8),
        (4, 2, 1),
        (4, 2, 8),
        (8, 1, 1),
        (8, 1, 8),
    ]
    assert (df.gpus == 8).all() and (df.model == "kimi-k2.6").all() and (df.engine == "sglang").all()
    assert df.attrs["skipped"] == []
    assert (df.layers_per_stage[df.pp == 8] == "7,7,7,8,8,8,8,8").all()  # SGLang's split of 61 layers
    # GPU time: compute + all-reduce + idle = 1, idle split by cause
    total = df.compute_share + df.allreduce_share + df.bubble_fraction
    assert total.tolist() == pytest.approx([1.0] * len(df), abs=1e-9)
    idle = df.idle_p2p_share + df.idle_cpu_share + df.idle_bubble_share
    assert idle.tolist() == pytest.approx(df.bubble_fraction.tolist(), abs=1e-9)
    assert (df.allreduce_share[df.tp == 1] == 0).all() and (df.allreduce_share[df.tp > 1] > 0).all()
    assert df.output_tok_s_per_gpu.tolist() == pytest.approx((df.output_throughput_tok_s / 8).tolist())


def test_sweep_row_is_what_predict_says(serial, profile):
    # with its band: the headline corrected by the corpus residuals on its roofline share
    r = pipesim.predict(tp=2, pp=4, conc=8, profile=profile, intervals=True, **SMALL)
    row = serial[(serial.tp == 2) & (serial.conc == 8)].iloc[0]
    assert row.output_throughput_tok_s == r.output_throughput_tok_s
    assert row.per_request_tok_s == r.per_request_tok_s and row.ttft_ms_p99 == r.ttft_ms_p99
    assert row.bubble_fraction == r.bubble_fraction and row.sim_events == r.sim_events


def test_local_processes_give_the_serial_table(serial, profile):
    parallel = sweep(8, list(reversed(CONC)), profile=profile, workers=2, **SMALL)
    pd.testing.assert_frame_equal(deterministic(parallel), deterministic(serial))


def test_dask_cluster_gives_the_local_table(profile, tmp_path):
    """Llama 3.1 8B on 2 GPUs: two splits (TP2, PP2) x two concurrencies, on a local
    Dask cluster of two worker processes and on local processes: the same table, and
    the same streamed to a file."""
    from pipesim.base.files import read_table

    distributed = pytest.importorskip("distributed")
    args = dict(model="llama-3.1-8b", profile=profile, **SMALL)
    local = sweep(2, CONC, workers=2, **args)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        remote = sweep(2, CONC, scheduler=cluster.scheduler_address, out=tmp_path / "d.csv", **args)
    assert list(remote[["tp", "pp"]].drop_duplicates().itertuples(index=False, name=None)) == [(1, 2), (2, 1)]
    assert len(remote) == 4
    pd.testing.assert_frame_equal(deterministic(remote), deterministic(local))
    pd.testing.assert_frame_equal(deterministic(read_table(tmp_path / "d.csv")), deterministic(local))


def test_invalid_splits_are_skipped_with_the_reason(profile):
    df = sweep([2, 8], [4], profile=profile, workers=1, **SMALL)
    assert sorted(set(df.gpus)) == [8]
    skipped = df.attrs["skipped"]
    assert len(skipped) == 2 and all("does not fit" in s for s in skipped)
    assert {s.split(" (")[0] for s in skipped} == {"TP2 x PP1", "TP1 x PP2"}


def test_several_gpu_counts(profile):
    df = sweep([1, 2], [2], model="llama-3.1-8b", profile=profile, workers=1, **SMALL)
    assert list(df[["gpus", "tp", "pp"]].itertuples(index=False, name=None)) == [
        (1, 1, 1),
        (2, 1, 2),
        (2, 2, 1),
    ]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(gpus=4), "no valid TP x PP split for 4 GPUs"),
        (dict(conc=[]), "conc is empty"),
        (
            dict(conc="1,8"),
            "conc '1,8' must be a whole number or a sequence of them",
        ),  # text is the CLI's to parse
        (dict(gpus=0), "gpus: 0 is not a whole number >= 1"),
        (dict(gpus=[8, True]), "gpus: True is not a whole number >= 1"),
        (dict(model="no-such-model"), "unknown model 'no-such-model'"),  # not about a split: said as is
        (dict(rate_rps=2.0), "takes no rate_rps"),
    ],
)
def test_sweep_bad_input(profile, kwargs, needle):
    args = dict(gpus=8, conc=[1], profile=profile, workers=1, **SMALL)
    args.update(kwargs)
    with pytest.raises(pipesim.UserError, match=None) as exc:
        sweep(**args)
    assert needle in str(exc.value)


def test_best_by_conc(serial):
    best = best_by_conc(serial)
    assert best.conc.tolist() == CONC
    for row in best.itertuples():
        at = serial[serial.conc == row.conc]
        assert row.output_throughput_tok_s == at.output_throughput_tok_s.max()


def test_profile_objects_travel_to_workers(profile):
    """A what-if profile (an object, not a name) reaches the worker processes."""
    cheap = dataclasses.replace(profile, params=dataclasses.replace(profile.params, allreduce_scale=0.25))
    base = sweep(8, [4], profile=profile, workers=1, **SMALL)
    what_if = sweep(8, [4], profile=cheap, workers=2, **SMALL)
    tp8 = lambda df: df[df.tp == 8].iloc[0]  # noqa: E731
    assert tp8(what_if).allreduce_share < tp8(base).allreduce_share
    assert (what_if.allreduce_share[what_if.tp == 1] == 0).all()


def test_open_loop_sweep_by_rate(profile):
    """--rate sweeps arrival rates: one row per split and rate, the load in rate_rps,
    the saturation verdict per row, the summary by req/s."""
    from pipesim.explore.sweep import load_column, summary

    df = sweep(8, rate=[0.25, 50.0], profile=profile, workers=1, num_requests=40, **SMALL)
    assert load_column(df) == "rate_rps" and (df.conc == 0).all()
    assert sorted(df.rate_rps.unique()) == [0.25, 50.0]
    # 50 req/s of 40-token answers is far past what any split serves; 0.25 req/s is not
    assert df[df.rate_rps == 50.0].overloaded.all() and not df[df.rate_rps == 0.25].overloaded.any()
    text = summary(df)
    table = text.split("\n\n")[1].splitlines()  # heading, table, the bands' lines
    assert "req/s" in table[0] and "! = overloaded" in text and "!" in table[-1]


def test_rows_carry_what_caps_the_running_requests(profile):
    """SGLang's defaults with --max-running-requests 64 at pp 8: per-slot cap 64 // 8 = 8
    (Scheduler.__init__), 8 slots, so 64 at most; the KV cache holds kv_tokens //
    (64 + 40) requests of this workload."""
    df = sweep(8, [1], profile=profile, workers=1, max_running_requests=64, **SMALL)
    pp8 = df[df.pp == 8].iloc[0]
    assert (pp8.running_cap, pp8.slot_cap, pp8.slots) == (64, 8, 8)
    assert pp8.kv_request_cap == pp8.kv_cache_tokens // (64 + 40)
    assert pp8.effective_cap == min(64, pp8.kv_request_cap)
    assert pp8.cap_reason in ("running cap", "per-slot cap x slots")
    assert [float(x) for x in pp8.decode_batch_per_slot.split(";")].__len__() == 8


def test_vllm_rows_carry_group_sizes(vllm_profile):
    # vLLM's in-flight groups (the analogue of decode_batch_per_slot) as a ';'-joined
    # column, one entry per batch in flight (max_concurrent_batches: pp with PP, async
    # scheduling off; 2 at PP 1, where it is on by default); the eviction count too
    df = sweep(4, [4], profile=vllm_profile, engine="vllm", model="llama-3.1-8b", workers=1, **SMALL)
    assert len(df) == 3
    for row in df.itertuples():
        groups = [float(x) for x in str(row.group_sizes).split(";")]
        assert len(groups) == (row.pp if row.pp > 1 else 2) and all(g >= 0 for g in groups)
        assert row.preemptions == 0


def test_rows_carry_the_slots_by_position(profile, tmp_path):
    """Every split's slots by position, read back from the file as written: one entry
    per slot (TP2 x PP4: 4, PP8: 8; TP8: its one slot and the overlap scheduler's next
    batch, launched before the last one is back: 2), shares in [0, 1], mean requests
    non-increasing, and the mean number in flight the positions' busy shares summed;
    a DP split has none."""
    from pipesim.base.files import read_table, write_table

    df = sweep(8, [16], profile=profile, workers=1, **SMALL)
    write_table(df, tmp_path / "s.csv")
    back = read_table(tmp_path / "s.csv")
    for row in back[back.dp == 1].itertuples():
        means = [float(x) for x in str(row.occupancy_by_position).split(";")]
        empty = [float(x) for x in str(row.empty_share_by_position).split(";")]
        assert len(means) == len(empty) == (row.slots if row.pp > 1 else 2)
        assert all(0.0 <= e <= 1.0 for e in empty) and means == sorted(means, reverse=True)
        assert row.batches_in_flight == pytest.approx(sum(1 - e for e in empty), abs=1e-3)
    dp = sweep(8, [16], profile=profile, workers=1, dp=[2], model="qwen3-30b-a3b", **SMALL)
    assert list(dp.dp) == [2]
    assert dp[["occupancy_by_position", "empty_share_by_position", "batches_in_flight"]].isna().all().all()


def test_rows_carry_the_cheap_likely_band_of_each_headline_number(serial, profile):
    from pipesim.base.files import INTERVAL_COLUMNS
    from pipesim.report import uncertainty

    assert INTERVAL_COLUMNS == uncertainty.HEADLINE  # the table schema names every banded number
    sc = pipesim.build_scenario(tp=2, pp=4, concurrency=8, profile=profile, **SMALL)
    r = pipesim.run(sc)
    iv, _ = uncertainty.intervals(r, sc, workload="run")  # from the run itself, no extra run
    row = serial[(serial.tp == 2) & (serial.conc == 8)].iloc[0]
    for m in INTERVAL_COLUMNS:
        assert (row[f"{m}_lo"], row[f"{m}_hi"]) == pytest.approx(iv[m])
        assert row[f"{m}_lo"] < row[m] < row[f"{m}_hi"]  # a measured profile: the band holds its value


def test_sweep_with_expert_parallel(profile):
    # every split's MoE layers expert-parallel over its TP group (SGLang: ep = tp); the rows
    # say so, and each is what predict says for the same plan
    df = sweep(splits=[(8, 1)], conc=[8], profile=profile, workers=1, enable_expert_parallel=True, **SMALL)
    assert list(zip(df.split, df.ep)) == [("TP8 x PP1 x EP8", 8)]
    r = pipesim.predict(tp=8, ep=8, conc=8, profile=profile, intervals=True, **SMALL)
    assert df.output_throughput_tok_s.iloc[0] == r.output_throughput_tok_s

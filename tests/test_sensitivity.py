"""Sensitivity tornado: the step rule, invariants of the model's response, the CLI."""

from __future__ import annotations

import pytest
from conftest import SHORT_LLAMA as FAST
from conftest import SHORT_LLAMA_ARGS

from pipesim.cli import main
from pipesim.profiles.profile import FITTABLE
from pipesim.report.sensitivity import sensitivity
from pipesim.scenario.build import build_scenario


@pytest.fixture(scope="module")
def sens():
    return sensitivity(build_scenario(tp=2, pp=2, concurrency=8, **FAST), 0.2)


def test_items_sorted_by_throughput_swing(sens):
    swings = [abs(i.swing(sens.base)) for i in sens.items]
    assert swings == sorted(swings, reverse=True)


def test_zero_parameters_move_up_by_their_fit_step(sens):
    by = {i.name: i for i in sens.items}
    # the default profile has no all-reduce offset: 20% of 0 is 0, so it moves up only
    assert by["allreduce_offset_us"].low is None
    assert float(by["allreduce_offset_us"].high_label) == FITTABLE["allreduce_offset_us"][2]
    # its measured front end (0.24 ms per request) moves both ways by the step
    fe = by["frontend_ms"]
    assert (float(fe.low_label), float(fe.high_label)) == pytest.approx((0.24 * 0.8, 0.24 * 1.2))


def test_slower_kernels_never_raise_throughput(sens):
    k = {i.name: i for i in sens.items}["kernel_scale"]
    assert (
        k.high["output_throughput_tok_s"]
        < sens.base["output_throughput_tok_s"]
        < k.low["output_throughput_tok_s"]
    )


def test_eager_launch_cost_reaches_prefill_only_under_cuda_graphs(sens):
    # SGLang replays decode from CUDA graphs by default (costs/host.py: a graphed step pays
    # no eager launch); prefill runs eagerly, so only TTFT moves. (The profile's own
    # eager_launch_us_per_layer was fitted on Kimi's layers: Llama's layers launch their
    # kernel count at launch_us_per_kernel.)
    e = {i.name: i for i in sens.items}["launch_us_per_kernel"]
    assert e.swing(sens.base, "tpot_ms_p50") == pytest.approx(0, abs=1e-9)
    assert e.high["ttft_ms_p50"] > sens.base["ttft_ms_p50"] > e.low["ttft_ms_p50"]


def test_cli_table_and_plot(tmp_path, capsys):
    out = tmp_path / "tornado.png"
    main(
        [
            "predict",
            "--tp",
            "2",
            "--pp",
            "2",
            "--conc",
            "4",
            *SHORT_LLAMA_ARGS,
            "--sensitivity",
            "--plot",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert "kernel_scale" in text and "swing" in text
    assert out.stat().st_size > 1000


def test_a_swing_is_what_a_prediction_at_the_moved_value_says(sens):
    """Each run is as long as a prediction's: the item's figure is pipesim.predict's (its
    simulated figure, intervals off) at the moved value, not a short run's."""
    import pipesim

    item = {i.name: i for i in sens.items}["input_len"]
    moved = pipesim.predict(2, 2, 8, **{**FAST, "input_len": item.high_label}, intervals=False)
    assert item.high["output_throughput_tok_s"] == moved.output_throughput_tok_s
    assert item.high["ttft_ms_p50"] == moved.ttft_ms_p50


def _strict(text: str):
    import json

    def refuse(token):
        raise ValueError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_even_where_a_figure_is_not_a_number(capsys):
    # one output token: no TPOT, so a per-request speed and TPOT that are not numbers
    main(
        ["predict", "--tp", "2", "--conc", "2", "--model", "llama-3.1-8b", "--input-len", "16"]
        + ["--output-len", "1", "--sensitivity", "--json"]
    )
    data = _strict(capsys.readouterr().out)
    assert data["base"]["tpot_ms_p50"] is None
    assert {i["name"] for i in data["items"]} >= {"kernel_scale", "input_len"}


def test_parallel_and_stored_runs_give_the_serial_tornado(sens, tmp_path, monkeypatch):
    """On two processes, and again from the store, the same numbers; a stored run is not
    simulated again, a changed scenario is."""
    from pipesim.base.cache import ResultCache
    from pipesim.report import sensitivity as S

    sc = build_scenario(tp=2, pp=2, concurrency=8, **FAST)
    store = ResultCache(tmp_path)
    parallel = sensitivity(sc, 0.2, jobs=2, cache=store)
    assert parallel.to_dict() == sens.to_dict()
    import pipesim.base.pool as pool

    ran = []
    real = pool.map_shared
    monkeypatch.setattr(
        pool, "map_shared", lambda fn, sh, tasks, *a: ran.extend(tasks) or real(fn, sh, tasks, *a)
    )
    assert sensitivity(sc, 0.2, cache=store).to_dict() == sens.to_dict() and ran == []
    other = build_scenario(tp=2, pp=2, concurrency=8, seed=1, **FAST)
    sensitivity(other, 0.2, cache=store)
    assert len(ran) == len(S.runs(other, 0.2))


def test_every_run_of_the_tornado_is_counted_in_the_work_bound(monkeypatch):
    import pipesim.base.checks as checks
    from pipesim.base.errors import UserError
    from pipesim.report import sensitivity as S
    from pipesim.scenario.build import scenario_steps

    sc = build_scenario(tp=2, pp=2, concurrency=8, **FAST)
    one = scenario_steps(sc)[0]
    monkeypatch.setattr(checks, "MAX_BATCH_STEPS", one * 5)  # the scenario alone fits, its 25 runs do not
    with pytest.raises(UserError, match="runs of the tornado"):
        sensitivity(sc, 0.2)
    assert len(S.runs(sc, 0.2)) > 5

"""A sweep's scenarios: the product of its lists, each key once, built before any runs;
a scenario above a limit skipped with its reason; the sweep's size and total work
bounded (checks.py) with the way round said."""

import pytest

import pipesim
import pipesim.base.checks
from pipesim.explore.grid import KEY_COLUMNS, build_grid, choices
from pipesim.explore.sweep import sweep

LLAMA = dict(model="llama-3.1-8b")


def lists(box=None, engine=None, input_len="64", output_len="40") -> dict:
    return dict(
        box=choices(box, "box"),
        engine=choices(engine, "engine"),
        input_len=choices(input_len, "input length"),
        output_len=choices(output_len, "output length"),
    )


def test_the_grid_is_the_product_in_table_order():
    grid = build_grid([2], [1.0, 8.0], False, LLAMA, lists(engine=["sglang", "vllm"], input_len=["64", 96]))
    assert len(grid.points) == 2 * 2 * 2 * 2 and grid.skipped == ()
    conc = KEY_COLUMNS.index("conc")
    assert [(p.key[1], p.key[2], p.tp, p.pp, p.key[conc]) for p in grid.points] == [
        (e, i, tp, pp, c)
        for e in ("sglang", "vllm")
        for i in ("64", "96")
        for tp, pp in ((1, 2), (2, 1))
        for c in (1, 8)
    ]
    assert len({p.key for p in grid.points}) == len(grid.points)


def test_boxes_are_keyed_by_their_names():
    pytest.importorskip("aiconfigurator_core")  # the H100 box is costed from the catalogue's tables
    grid = build_grid([1], [1.0], False, LLAMA, lists(box=["rtx-pro-6000-server-8x", "h100-sxm-8x"]))
    assert [p.key[0] for p in grid.points] == ["rtx-pro-6000-server-8x", "h100-sxm-8x"]


def test_values_that_resolve_to_one_scenario_are_refused():
    # no engine given is the default profile's engine, SGLang: the same scenarios twice
    with pytest.raises(pipesim.UserError, match="list each once"):
        build_grid([1], [1.0], False, LLAMA, lists(engine=[None, "sglang"]))
    assert choices(["64", 64, "64"], "input length") == ["64"]  # one length written two ways


def test_a_scenario_above_the_run_limit_is_skipped_with_its_reason():
    # C = 1: 1 + 16 requests x 30,000 tokens / batch 1 = 510,000 decode steps, above 500,000;
    # C = 8: (8 + 16) x 30,000 / 8 = 90,000 (scenario.workload_steps; the KV cache holds 8)
    grid = build_grid([1], [1.0, 8.0], False, LLAMA, lists(output_len="30000"))
    assert [p.load for p in grid.points] == [8.0]
    assert grid.points[0].steps == pytest.approx(24 * 30_000 / 8)
    [why] = grid.skipped
    assert why.startswith("TP1 x PP1 (1 GPUs) at C=1: this run needs about 510,000 decode batch steps")


def test_a_split_no_load_accepts_is_skipped_once():
    # Kimi K2.6 fits on no 2 GPUs: each 2-GPU split is one line, whatever the load
    grid = build_grid([2, 8], [1.0, 8.0], False, {}, lists())
    assert {(p.tp, p.pp) for p in grid.points} == {(8, 1), (4, 2), (2, 4), (1, 8)}
    assert [s.split(": ")[0] for s in grid.skipped] == ["TP1 x PP2 (2 GPUs)", "TP2 x PP1 (2 GPUs)"]
    assert all("does not fit" in s for s in grid.skipped)


def test_the_number_of_scenarios_is_bounded_before_any_is_built():
    # 4 splits of 8 GPUs x 30,000 concurrencies = 120,000 scenarios
    with pytest.raises(pipesim.UserError) as exc:
        sweep(8, list(range(1, 30_001)), **LLAMA, workers=1)
    msg = str(exc.value)
    assert "120,000 scenarios" in msg and "above the limit of 100,000" in msg and "split it" in msg


def test_the_total_work_is_bounded(monkeypatch):
    # TP2 and PP2 at C = 1 and 8, 40 output tokens: 2 x (17 x 40 / 1 + 24 x 40 / 8) = 1,600 steps
    monkeypatch.setattr(pipesim.base.checks, "MAX_SWEEP_BATCH_STEPS", 1_000)
    with pytest.raises(pipesim.UserError) as exc:
        sweep(2, [1, 8], **LLAMA, input_len="64", output_len="40", workers=1)
    msg = str(exc.value)
    assert "4 scenarios need about 1,600 decode batch steps" in msg and "above the limit of 1,000" in msg

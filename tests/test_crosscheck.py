"""Cross-check against the validation corpus: how a corpus run becomes a scenario,
what is skipped and why, the error, coverage and ranking arithmetic. Runs on a small
fixture corpus in the corpus schema (tests/data/corpus: invented numbers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipesim.calibrate import crosscheck as X
from pipesim.calibrate.corpus import load_corpus
from pipesim.cli import main
from pipesim.report import uncertainty as U

FIXTURE = Path(__file__).resolve().parent / "data" / "corpus"
DOC = Path(__file__).resolve().parent.parent / "docs" / "validation.md"


@pytest.fixture(scope="module")
def chk():
    return X.check(load_corpus(FIXTURE))


def test_boxes_by_gpu_name():
    assert X.box_for("NVIDIA H200 141GB x4") == "h200-sxm-8x"
    assert X.box_for("NVIDIA H100 SXM x2") == "h100-sxm-8x"
    assert X.box_for("NVIDIA A100 SXM 80GB x8") == "a100-sxm-8x"
    with pytest.raises(X.Skip, match="no box preset"):
        X.box_for("NVIDIA A100 40GB SXM x8")  # the preset is the 80 GB part


def test_models_by_architecture_and_weight_format():
    assert X.model_for("meta-llama/Llama-3.3-70B-Instruct", "bf16 (checkpoint)") == "llama-3.1-70b"
    assert X.model_for("deepseek-ai/DeepSeek-R1-0528", "fp8 (checkpoint)") == "deepseek-v3"
    with pytest.raises(X.Skip, match="preset is bf16"):
        X.model_for("meta-llama/Llama-3.1-8B-Instruct", "fp8 (checkpoint)")
    with pytest.raises(X.Skip, match="sparse attention"):
        X.model_for("deepseek-ai/DeepSeek-V3.2", "fp8 (checkpoint)")
    # an FP8 checkpoint's own preset, not the bf16 one whose name it contains
    assert X.model_for("Qwen/Qwen3-32B-FP8", "fp8 (checkpoint)") == "qwen3-32b-fp8"
    assert X.model_for("Qwen/Qwen3-32B", "bf16 (checkpoint)") == "qwen3-32b"
    assert X.model_for("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", "fp8 (checkpoint)") == "qwen3-235b-a22b-fp8"
    assert X.model_for("openai/gpt-oss-120b", "mxfp4 (checkpoint MoE weights)") == "gpt-oss-120b"
    assert X.model_for("zai-org/GLM-4.6-FP8", "fp8 (checkpoint)") == "glm-4.6-fp8"
    with pytest.raises(X.Skip, match="AWQ"):
        X.model_for("Qwen/Qwen3-14B-AWQ", "bf16 (checkpoint)")


def test_lengths_from_the_workload_text():
    assert X.lengths_for("random, input 4000 tokens, output 200 tokens, seed 42") == ("4000", "200")
    # sglang.bench_serving with random_range_ratio 0 draws uniform [1, L]
    assert X.lengths_for(
        "random, --random-input 1024 --random-output 512, random_range_ratio 0.0 (as recorded), "
        "sglang.bench_serving --backend sglang"
    ) == ("1:1024", "1:512")
    with pytest.raises(X.Skip, match="ShareGPT: the run prints no token totals"):
        X.lengths_for("ShareGPT (sharegpt.json), 200 prompts")
    # ShareGPT: the run's own mean lengths, (4150 - 2000) / 10 in and 2000 / 10 out
    totals = {"output_tok_s": 2000.0, "total_tok_s": 4150.0, "request_s": 10.0}
    assert X.lengths_for("ShareGPT (sharegpt.json), 1000 prompts", totals) == ("215", "200")
    # "~20k input and ~2k output tokens (+-15% variance)": uniform within 15%
    assert X.lengths_for(
        "vllm bench serve, 150 requests, ~20k input tokens and ~2k output tokens (+-15% variance)"
    ) == ("17000:23000", "1700:2300")


def test_engine_flags_become_knobs():
    assert X.knobs_for("vllm", "vllm serve m -tp 2 --max-num-seqs 64 --max-num-batched-tokens 8192") == {
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
    }
    with pytest.raises(X.Skip, match="--speculative"):
        X.knobs_for("sglang", "python3 -m sglang.launch_server --tp 8 --speculative-algorithm EAGLE")
    # the host loop's switches as launched (docs/engines.md §10)
    assert X.knobs_for("vllm", "vllm serve m --async-scheduling --num-scheduler-steps 10") == {
        "async_scheduling": True,
        "num_scheduler_steps": 10,
    }
    assert X.knobs_for("sglang", "python3 -m sglang.launch_server --disable-overlap-schedule") == {
        "disable_overlap_schedule": True
    }


def test_both_paths_run_the_row_s_engine_release():
    """The release picks the host loop and its rules (docs/engines.md §10): vLLM 0.11 has
    no async scheduling by default, the catalogue's newest tables (0.24) would."""
    run = {
        "hardware": "NVIDIA H100 80GB HBM3 x1",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "quantization": "bf16 (checkpoint)",
        "kv_cache_dtype": "",
        "workload": "random, input 128 tokens, output 4 tokens, seed 42, vllm bench serve",
        "engine": "vllm",
        "engine_version": "0.11.0",
        "launch_flags": "vllm serve m",
        "tp": 1,
        "pp": 1,
        "dp": 1,
        "ep": 1,
        "nodes": 1,
        "concurrency": 4,
        "request_rate": float("nan"),
        "num_prompts": 100,
    }
    for path in X.PATHS:
        sc = X.scenario_for(run, path=path)
        assert sc.engine_version == "0.11.0" and not sc.settings.host.overlap
        flagged = X.scenario_for({**run, "launch_flags": "vllm serve m --async-scheduling"}, path=path)
        assert flagged.settings.host.overlap


def test_parallel_flags_are_expressed():
    """DP attention, expert parallel and nodes are pipesim's now (docs/parallel.md): the
    row's sizes and its flags become build_scenario's keywords, not a skip."""
    run = {"dp": 1, "ep": 1, "nodes": 1, "launch_flags": "python3 -m sglang.launch_server --tp-size 8"}
    assert X.parallel_for(run) == {"dp": 1, "ep": 1, "nodes": 1}
    run = {**run, "launch_flags": "... --tp-size 8 --enable-dp-attention", "dp": 8}
    assert X.parallel_for(run) == {"dp": 8, "ep": 1, "nodes": 1, "dp_attention": True}
    run = {"dp": 1, "ep": 8, "nodes": 2, "launch_flags": "vllm serve m -tp 8 --enable-expert-parallel"}
    assert X.parallel_for(run) == {"dp": 1, "ep": 8, "nodes": 2, "enable_expert_parallel": True}


def test_pairwise_agreement_and_kendall_by_hand():
    # pairs (1,2) and (1,3) ordered alike, (2,3) reversed
    assert X.pairwise_agreement([1, 2, 3], [1, 3, 2]) == (pytest.approx(2 / 3), 3)
    assert X.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_fixture_corpus_as_the_check_sees_it(chk):
    assert chk.corpus == {
        "rows": 8,
        "runs": 4,
        "sources": 1,
        "rows_pp_gt_1": 0,
        "runs_pp_gt_1": 0,
        "sources_with_several_splits": 1,
    }
    reasons = dict(zip(chk.skipped.run_id, chk.skipped.reason))
    assert "ShareGPT" in reasons["fixture-h100-llama8b-r03"]
    assert "no model preset for google/gemma-3-27b-it" in reasons["fixture-h100-llama8b-r04"]


def test_each_number_compared_once_with_its_error_and_band(chk):
    rows = chk.rows.set_index("row_id")
    assert sorted(rows.index) == [
        "fixture-h100-llama8b-001",
        "fixture-h100-llama8b-002",
        "fixture-h100-llama8b-004",
    ]
    for df in (chk.rows, chk.roofline):
        for r in df.itertuples():  # itl_ms_mean (row 003) is not a pipesim metric: left out
            assert r.error_pct == pytest.approx((r.predicted - r.measured) / r.measured * 100)
            assert r.lo < r.hi and r.inside == (r.lo <= r.measured <= r.hi)
            # the band is the prediction's, centred where the corpus residuals put it (a
            # catalogue profile's measured share: the residuals of measured tables)
            tables = U.table_residuals() if r.table_band else None
            c, below, above = U.band_log(
                r.family,
                r.calibration_rel,
                r.unmeasured_share,
                (0.0, r.simulation_rel, r.unchecked_rel),
                None,
                tables,
            )
            assert (r.lo, r.hi) == pytest.approx(
                (r.predicted * math.exp(c - below), r.predicted * math.exp(c + above))
            )
    # the user's path: what `pipesim predict --box h100-sxm-8x --engine vllm` gives, the
    # catalogue's profile (AIConfigurator's measured H100 tables), nearly all measured
    assert set(rows.profile) == {"aiconfigurator-h100_sxm-vllm"} and set(rows.path) == {"user"}
    assert rows.unmeasured_share.max() < 0.5
    # the roofline path: the same numbers with no table at all
    roof = chk.roofline.set_index("row_id")
    assert sorted(roof.index) == sorted(rows.index) and set(roof.profile) == {"roofline-vllm"}
    assert roof.unmeasured_share.min() == pytest.approx(1.0)
    assert (roof.measured == rows.measured).all()


def test_ranking_over_the_two_splits(chk):
    assert len(chk.ranking) == 1
    g = chk.ranking.iloc[0]
    assert g.pairs == 1 and g.splits == "TP1xPP1,TP2xPP1"


def test_cli_text_and_json(capsys):
    main(["validate", "--corpus", str(FIXTURE)])
    out = capsys.readouterr().out
    assert "corpus: 8 rows, 4 runs, 1 sources" in out
    assert "overall, user path" in out and "overall, roofline path" in out
    main(["validate", "--corpus", str(FIXTURE), "--json", "--jobs", "1"])
    d = json.loads(capsys.readouterr().out)
    assert d["overall"]["numbers"] == 3 and len(d["skipped"]) == 2
    assert d["overall_roofline"]["numbers"] == 3 and len(d["roofline_rows"]) == 3
    assert {m["metric"] for m in d["per_metric"]} == {m["metric"] for m in d["per_metric_roofline"]}


def test_validation_doc_states_the_shipped_corpus():
    # docs/validation.md is regenerated by calibration/validate_corpus.py; it must
    # describe the corpus that ships now
    c = X.summary(load_corpus())
    assert f"{c['rows']} rows, {c['runs']} runs, {c['sources']} sources" in DOC.read_text()


def test_splits_are_compared_only_when_the_launch_differs_in_the_parallel_flags_alone():
    from pipesim.calibrate.corpus_report import other_flags

    pp4 = "python3 -m sglang.launch_server --model-path zai-org/GLM-4.5-Air  --pp-size 4"
    tp4 = "python3 -m sglang.launch_server --model-path zai-org/GLM-4.5-Air --tp-size 4"
    assert other_flags(pp4) == other_flags(tp4)
    # a step that also turns on async scheduling is not a split comparison
    assert other_flags("vllm serve m --max-model-len 32768") != other_flags(
        "vllm serve m --max-model-len 32768 --async-scheduling -tp 2"
    )
    assert other_flags("vllm serve m --tensor-parallel-size=4 --enable-expert-parallel") == "vllm serve m"


def _run(**kw):
    base = {
        "hardware": "NVIDIA H100 SXM x8",
        "model": "zai-org/GLM-4.5-Air",
        "quantization": "bf16 (checkpoint)",
        "kv_cache_dtype": "",
        "workload": "random, input 1000 tokens, output 100 tokens",
        "engine": "sglang",
        "launch_flags": "python3 -m sglang.launch_server --tp-size 4 --ep-size 4",
        "tp": 4,
        "pp": 1,
        "dp": 1,
        "ep": 4,
        "nodes": 1,
        "concurrency": 8,
        "request_rate": None,
        "num_prompts": 64,
    }
    return {**base, **kw}


def test_an_expert_parallel_run_by_both_paths():
    user = X.scenario_for(_run(), path="user")
    roof = X.scenario_for(_run(), path="roofline")
    assert (user.plan.tp, user.plan.ep, user.plan.moe_tp) == (4, 4, 1)
    assert roof.plan == user.plan
    # the user's path is what `pipesim predict --box h100-sxm-8x --engine sglang` gives
    assert user.profile.name == "aiconfigurator-h100_sxm-sglang" and len(user.profile.tables)
    assert roof.profile.name == "roofline-sglang" and not len(roof.profile.tables)


def test_dp_attention_nodes_and_vllm_expert_parallel_are_expressed():
    # SGLang turns DP attention off at dp 1 (docs/parallel.md §1): TP8 as launched
    r1 = X.scenario_for(
        _run(
            model="deepseek-ai/DeepSeek-R1-0528",
            quantization="fp8 (checkpoint)",
            launch_flags="--tp-size 8 --enable-dp-attention",
            tp=8,
            ep=1,
            hardware="NVIDIA H200 SXM x8",
        )
    )
    assert (r1.plan.tp, r1.plan.dp, r1.plan.dp_attention) == (8, 1, False)
    # vLLM's --enable-expert-parallel: EP over dp x tp
    q = X.scenario_for(
        _run(
            model="Qwen/Qwen3-235B-A22B-Instruct-2507-FP8",
            quantization="fp8 (checkpoint)",
            engine="vllm",
            launch_flags="vllm serve m -tp 8 --enable-expert-parallel",
            tp=8,
            ep=8,
        )
    )
    assert q.plan.ep == 8
    # two nodes: two copies of the box joined by its own network
    two = X.scenario_for(
        _run(
            model="meta-llama/Llama-3.3-70B-Instruct",
            launch_flags="vllm serve m -tp 8 -pp 2",
            engine="vllm",
            tp=8,
            pp=2,
            ep=1,
            nodes=2,
        )
    )
    assert two.box.nodes == 2 and two.box.gpu_count == 16


def test_stored_and_parallel_runs_give_the_same_check(chk, tmp_path, monkeypatch):
    """On two processes, then from the store, the same compared numbers; a stored run
    is not simulated again, a run whose rows changed is."""
    import pipesim.base.pool as pool
    from pipesim.base.cache import ResultCache

    store = ResultCache(tmp_path)
    corpus = load_corpus(FIXTURE)
    first = X.check(corpus, jobs=2, cache=store)
    assert first.rows.equals(chk.rows) and first.roofline.equals(chk.roofline)
    ran, real = [], pool.map_shared
    monkeypatch.setattr(
        pool, "map_shared", lambda fn, sh, tasks, *a: ran.extend(tasks) or real(fn, sh, tasks, *a)
    )
    again = X.check(corpus, cache=store)
    assert ran == [] and again.rows.equals(chk.rows) and again.skipped.equals(chk.skipped)
    changed = corpus.copy()
    run_id = chk.rows.run_id.iloc[0]
    changed.loc[changed.run_id == run_id, "value"] *= 1.1
    X.check(changed, cache=store)
    assert len(ran) == 1 and ran[0].run_id.iloc[0] == run_id


def test_the_runs_left_to_simulate_are_counted_in_the_work_bound(monkeypatch):
    import pipesim.base.checks as checks
    from pipesim.base.errors import UserError

    monkeypatch.setattr(checks, "MAX_SWEEP_BATCH_STEPS", 10)
    with pytest.raises(UserError, match="decode batch steps together"):
        X.check(load_corpus(FIXTURE))

"""Live calibration, the run: the one-line errors, a whole run on the CPU with a tiny
model, the budget, a failing operation, and the H200 cross-check script."""

import importlib.util
import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from pipesim.calibrate.live import kernels, run, specs
from pipesim.cli import main
from pipesim.inputs.model import load_model
from pipesim.profiles.profile import load_profile
from pipesim.profiles.writing import write_profile

REPO = Path(__file__).resolve().parent.parent
AIC_H200 = REPO.parent / "shared" / "reference-data" / "aiconfigurator" / "h200_sxm"
TINY_GRIDS = specs.Grids(
    m=(1, 16),
    decode_batch=(1, 4),
    decode_context=(64, 128),
    prefill_isl=(32, 64),
    prefill_batch_extra=(2,),
    moe_tokens=(1, 8, 64),
    sampling_batch=(1, 4),
    tps=(1, 2),
    comm_bytes=(1024, 4096),
    hf_batches=(1,),
    hf_prompt=8,
)


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_torch = pytest.mark.skipif(not has("torch"), reason="torch is not installed (pipesim[live])")
needs_transformers = pytest.mark.skipif(
    not (has("torch") and has("transformers")), reason="needs pipesim[live]"
)


# ---- the one-line errors ----------------------------------------------------------------


def expect_one_line(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_without_torch_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    expect_one_line(
        capsys,
        ["calibrate", "live", "--model", "llama-3.1-8b", "--out", str(tmp_path / "p")],
        "pipesim: error: live calibration needs torch: pip install 'pipesim[live]'",
    )
    assert not (tmp_path / "p").exists()


def test_without_cuda_one_line(monkeypatch, capsys, tmp_path):
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    expect_one_line(
        capsys,
        ["calibrate", "live", "--model", "llama-3.1-8b", "--out", str(tmp_path / "p")],
        "no NVIDIA GPU is visible",
    )


@pytest.fixture
def tiny_moe(tmp_path):
    cfg = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
    }
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@needs_torch
def test_run_live_on_cpu_writes_a_loadable_profile(tmp_path, tiny_moe):
    path = run.run_live(
        tiny_moe, tmp_path / "prof", reps=3, warmup=1, grids=TINY_GRIDS, device="cpu", budget_s=120
    )
    p = load_profile(path)
    assert set(p.tables) == {"gemm", "gqa_decode", "gqa_prefill", "moe"}
    planned = specs.plan_specs(load_model(tiny_moe), TINY_GRIDS)
    for table, df in p.tables.items():
        assert len(df) == sum(1 for s in planned if s.table == table)  # every planned shape, tp 2 included
    assert set(p.tables["moe"]["distribution"]) == {"balanced", "power_law_1.01"}
    assert p.params.moe_distribution == "power_law_1.01" and p.params.kernel_floor_us > 0
    assert p.params.eager_launch_us_per_layer > 0
    assert p.meta["live"]["stage"] == "complete" and p.meta["live"]["skipped_optional"] == 0
    extras = pd.read_csv(path / "live_extras.csv")
    assert {"sampling", "plain_layer_launch", "graph_loop_floor"} <= set(extras["op"])


@needs_torch
def test_budget_skips_optional_extras_only(tmp_path, tiny_moe):
    path = run.run_live(
        tiny_moe, tmp_path / "prof", reps=3, warmup=1, device="cpu", budget_s=0.001, grids=TINY_GRIDS
    )
    p = load_profile(path)
    planned = specs.plan_specs(load_model(tiny_moe), TINY_GRIDS)
    assert p.meta["live"]["skipped_optional"] == sum(1 for s in planned if not s.required) > 0
    assert set(p.tables["moe"]["moe_tp"]) == {1}  # the tp=2 slices were optional
    assert len(p.tables["gemm"]) == sum(1 for s in planned if s.table == "gemm" and s.required)


# ---- the H200 cross-check script ------------------------------------------------------------


@pytest.mark.skipif(not AIC_H200.is_dir(), reason="AIConfigurator H200 tables not present")
def test_crosscheck_against_aiconfigurator(tmp_path):
    spec = importlib.util.spec_from_file_location("crosscheck", REPO / "calibration" / "crosscheck_h200.py")
    xc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(xc)
    ref = xc.reference_profile(AIC_H200)
    aic = ref.tables
    gemm = aic["gemm"][
        (aic["gemm"]["dtype"] == "bf16") & (aic["gemm"]["n"] == 4096) & (aic["gemm"]["k"] == 4096)
    ]
    exact = gemm[gemm["m"].isin([1, 4096])]
    between = gemm[gemm["m"] == 64].assign(m=100)  # AIConfigurator has 97 and 112, not 100
    dec = aic["gqa_decode"]
    dec = dec[
        (dec["heads_per_gpu"] == 32)
        & (dec["kv_heads_per_gpu"] == 8)
        & (dec["head_dim"] == 128)
        & (dec["batch"] == 16)
        & (dec["context"] == 1023)
    ].assign(latency_ms=lambda d: 2 * d["latency_ms"])
    meta = {"name": "x", "box": "h200-1x", "engine": "sglang"}
    write_profile(tmp_path / "m", meta, {"gemm": pd.concat([exact, between]), "gqa_decode": dec})
    rows = xc.compare(load_profile(tmp_path / "m"), ref)
    by = {(r.op, r.shape): r for r in rows.itertuples()}
    assert by[("gemm", "m=1 n=4096 k=4096")].ratio == pytest.approx(1.0)
    assert by[("gemm", "m=1 n=4096 k=4096")].match == "exact"
    assert by[("gemm", "m=100 n=4096 k=4096")].match == "interp"
    assert by[
        ("gqa_decode", "heads_per_gpu=32 kv_heads_per_gpu=8 head_dim=128 batch=16 context=1023")
    ].ratio == pytest.approx(2.0)
    s = xc.summary(rows).set_index("op")
    assert s.loc["gqa_decode", "median_ratio"] == pytest.approx(2.0) and s.loc["gemm", "shapes"] == 3


# ---- fault cases -------------------------------------------------------------------------


@needs_torch
def test_a_failing_operation_mid_run_keeps_the_rest(tmp_path, tiny_moe, monkeypatch):
    """A GPU error in one operation (here: every MoE kernel raises, as an out-of-memory
    or an illegal access would) is logged and skipped; every other table is written."""
    real_build = kernels.Ops.build

    def build(self, spec):
        if spec.table == "moe":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_build(self, spec)

    monkeypatch.setattr(kernels.Ops, "build", build)
    path = run.run_live(tiny_moe, tmp_path / "prof", reps=3, warmup=1, device="cpu", grids=TINY_GRIDS)
    p = load_profile(path)
    planned = specs.plan_specs(load_model(tiny_moe), TINY_GRIDS)
    assert "moe" not in p.tables and "gemm" in p.tables
    assert p.meta["live"]["failed"] == sum(1 for s in planned if s.table == "moe")

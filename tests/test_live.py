"""Live calibration without a GPU: what is planned, how records become a profile that
predict reads, the one-line errors, and (where torch is installed) the harness itself
on the CPU with a tiny model."""

import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipesim.calibrate.live import run as live
from pipesim.cli import main
from pipesim.costs import CostModel, Shape
from pipesim.hardware import load_box
from pipesim.model import load_model
from pipesim.plan import Plan
from pipesim.profile import TABLE_COLUMNS, load_profile

REPO = Path(__file__).resolve().parent.parent
AIC_H200 = REPO.parent / "shared" / "reference-data" / "aiconfigurator" / "h200_sxm"
GPU = {"name": "NVIDIA H200", "count": 1, "driver": "580.159.03", "torch": "2.11.0", "cuda": "13.0",
       "capability": 9.0, "sm_count": 132, "memory_bytes": 150754820096, "l2_bytes": 62914560,
       "copy_bw_bytes_s": 4.3e12, "bf16_flops": 7.9e14, "date": "2026-12-02"}
TINY_GRIDS = live.Grids(m=(1, 16), decode_batch=(1, 4), decode_context=(64, 128), prefill_isl=(32, 64),
                        prefill_batch_extra=(2,), moe_tokens=(1, 8, 64), sampling_batch=(1, 4), tps=(1, 2),
                        comm_bytes=(1024, 4096), hf_batches=(1,), hf_prompt=8)


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_torch = pytest.mark.skipif(not has("torch"), reason="torch is not installed (pipesim[live])")
needs_transformers = pytest.mark.skipif(not (has("torch") and has("transformers")), reason="needs pipesim[live]")


def fake_latency(spec: live.Spec) -> float:
    """A made-up but shape-dependent latency (ms), distinct per key."""
    return 0.002 + 1e-3 * float(np.log2(1 + np.prod([float(v) for v in spec.key if isinstance(v, int)])))


def synthetic_records(model):
    return [live.Record(s.table, s.key, fake_latency(s), "graph") for s in live.plan_specs(model) if s.required]


def write_synthetic(tmp_path, model_arg="llama-3.1-8b", gpu=GPU):
    model = load_model(model_arg)
    records = synthetic_records(model)
    box_name, box = live.box_name_or_dict(gpu)
    meta = live.profile_meta(name="synthetic", model_arg=model_arg, gpu=gpu, box=box_name,
                             params={"cpu_iteration_ms": 1.5, "eager_launch_us_per_layer": 300.0,
                                     "kernel_floor_us": 2.0, "not_a_param": 1.0},
                             param_sources={"cpu_iteration_ms": "measured"},
                             tables=sorted({r.table for r in records if r.table in TABLE_COLUMNS}),
                             reps=30, warmup=5, live={"stage": "complete"})
    return live._write(tmp_path / "prof", meta, records, [], box), records


# ---- planning ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_profile_covers_every_table_lookup_at_tp1(tmp_path, name):
    # the point of the plan: every GEMM, attention and MoE cost at TP1 comes from a measured row
    path, _ = write_synthetic(tmp_path, name)
    profile = load_profile(path)
    model = load_model(name)
    cm = CostModel(load_box("h200-1x"), model, Plan(1, 1, (model.num_layers,)), profile)
    ops = cm.stage_ops(0, Shape(decode=8, decode_ctx=1000, prefill=((300, 0),)))
    looked_up = [o for o in ops if "proj" in o.name or "mlp" in o.name and "act" not in o.name
                 or o.name in ("lm_head", "router gate", "routed experts", "attention decode", "attention prefill")]
    assert {o.name for o in looked_up} >= {"qkv proj", "o proj", "lm_head", "attention decode", "attention prefill"}
    assert all(o.source == "table" for o in looked_up), [(o.name, o.source) for o in looked_up if o.source != "table"]


def test_gemm_shapes_are_the_models_projections():
    m = load_model("llama-3.1-8b")
    shapes = live.gemm_shapes(m, 1)
    # qkv (32 + 2 x 8 heads of 128), o, gate_up (2 x 14336), down, lm_head
    assert shapes == [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
    assert (3072, 4096) in live.gemm_shapes(m, 2)           # qkv split over 2 GPUs


def test_plan_orders_required_first_and_respects_caps():
    m = load_model("qwen3-30b-a3b")
    g = live.Grids()
    specs = live.plan_specs(m, g)
    flags = [s.required for s in specs]
    assert flags == sorted(flags, reverse=True)            # every required spec before every optional one
    dec = [s for s in specs if s.table == "gqa_decode" and s.required]
    assert {s.key[:3] for s in dec} == {(32, 4, 128)}
    assert all(s.key[3] * s.key[4] <= g.decode_max_tokens for s in dec)
    moe = [s for s in specs if s.table == "moe" and s.required]
    assert {s.key[6] for s in moe} == {"balanced", "power_law_1.01"}
    assert {s.key[:6] for s in moe} == {("bf16", 2048, 768, 8, 128, 1)}
    assert len(moe) == 2 * len(g.moe_tokens)
    opt_moe = {s.key[5] for s in specs if s.table == "moe" and not s.required}
    assert opt_moe == {2, 4, 8}                            # 768 splits over 2, 4 and 8 GPUs
    mla = live.plan_specs(load_model("deepseek-v3"), g)
    assert {s.key[0] for s in mla if s.table == "mla_decode" and s.required} == {128}


def test_route_distinct_experts_and_skew():
    rng = np.random.default_rng(1)
    bal = live.route(4096, 128, 8, "balanced", rng)
    skew = live.route(4096, 128, 8, "power_law_1.01", rng)
    for ids in (bal, skew):
        assert ids.shape == (4096, 8) and ids.min() >= 0 and ids.max() < 128
        assert all(len(set(row)) == 8 for row in ids)         # top-k picks distinct experts
    load_bal = np.bincount(bal.ravel(), minlength=128)
    load_skew = np.bincount(skew.ravel(), minlength=128)
    assert load_bal.max() < 1.5 * load_bal.mean()            # uniform: every expert near 256 slots
    assert load_skew.max() > 3 * load_bal.max()               # Zipf: the favourite expert takes far more
    with pytest.raises(live.UserError, match="balanced"):
        live.route(4, 8, 2, "zipf", rng)


# ---- records -> tables -> profile ---------------------------------------------------------

def test_tables_from_records_schema_median_and_order():
    recs = [live.Record("gemm", ("bf16", 8, 4096, 4096), 0.03),
            live.Record("gemm", ("bf16", 1, 4096, 4096), 0.02),
            live.Record("gemm", ("bf16", 1, 4096, 4096), 0.04),
            live.Record("gemm", ("bf16", 1, 4096, 4096), 0.05),
            live.Record("gemm", ("bf16", 2, 4096, 4096), 0.0),          # a timer artefact: dropped
            live.Record("p2p", (0, 1, 1024), 0.011),
            live.Record("sampling", ("greedy", 4), 0.006)]
    t = live.tables_from_records(recs)
    assert set(t) == {"gemm", "p2p"}
    assert list(t["gemm"].columns) == list(TABLE_COLUMNS["gemm"]) + ["latency_ms"]
    assert t["gemm"]["m"].tolist() == [1, 8]
    assert t["gemm"]["latency_ms"].tolist() == [0.04, 0.03]            # median of 0.02, 0.04, 0.05
    extras = live.extras_frame(recs, [])
    assert extras.to_dict("records") == [{"op": "sampling", "params": "mode=greedy;batch=4", "value": 0.006,
                                          "unit": "ms"}]
    with pytest.raises(ValueError):
        live.tables_from_records([live.Record("gemm", (8, 4096, 4096), 0.03)])


def test_written_profile_metadata(tmp_path):
    path, records = write_synthetic(tmp_path)
    p = load_profile(path)
    assert p.box == "h200-1x" and p.engine == "sglang" and p.name == "synthetic"
    assert p.params.cpu_iteration_ms == 1.5 and p.params.eager_launch_us_per_layer == 300.0
    assert p.params.kernel_floor_us == 2.0
    assert set(p.tables) == {"gemm", "gqa_decode", "gqa_prefill"}
    for table in p.tables:
        src = p.sources[table]
        assert "NVIDIA H200" in src and "torch 2.11.0" in src and "CUDA 13.0" in src and "580.159.03" in src
        assert "2026-12-02" in src and "median of 30 reps after 5 warm-up" in src
    assert p.meta["gpu"]["name"] == "NVIDIA H200" and p.meta["model"] == "llama-3.1-8b"
    assert "not_a_param" not in p.meta["params"]             # only parameters the profile format knows
    n_gemm = sum(1 for r in records if r.table == "gemm")
    assert len(p.tables["gemm"]) == n_gemm


def test_predict_cli_reads_a_written_profile(tmp_path, capsys):
    path, _ = write_synthetic(tmp_path)
    main(["predict", "--profile", str(path), "--model", "llama-3.1-8b", "--conc", "2", "--input-len", "64",
          "--output-len", "12", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert d["scenario"]["box"] == "h200-1x" and d["scenario"]["profile"] == "synthetic"
    assert d["scenario"]["profile_params"]["cpu_iteration_ms"] == 1.5
    assert d["output_throughput_tok_s"] > 0


def test_box_file_beside_the_profile_for_other_gpus(tmp_path, capsys):
    gpu = dict(GPU, name="NVIDIA L40S", memory_bytes=48 * 2**30, copy_bw_bytes_s=7.5e11, bf16_flops=3.0e14)
    path, _ = write_synthetic(tmp_path, gpu=gpu)
    assert (path / "box.toml").is_file() and load_profile(path).box == str(path / "box.toml")
    box = load_box(path / "box.toml")
    assert box.gpu.name == "NVIDIA L40S" and box.gpu_count == 1
    assert box.gpu.mem_bw_bytes_s == 7.5e11 and box.gpu.flops_bf16 == 3.0e14 and box.gpu.flops_fp8 == 6.0e14
    # predict resolves the relative box.toml against the profile, from any working directory
    main(["predict", "--profile", str(path), "--model", "llama-3.1-8b", "--conc", "1", "--input-len", "32",
          "--output-len", "8", "--json"])
    assert json.loads(capsys.readouterr().out)["scenario"]["gpu"] == "NVIDIA L40S"


def test_multi_gpu_box_is_a_star_at_the_measured_p2p_rate(tmp_path):
    gpu = dict(GPU, count=4, p2p_bw_bytes_s=3.6e11, p2p_latency_us=12.0)
    name, box = live.box_name_or_dict(gpu)
    assert name == "box.toml" and box["gpu"]["count"] == 4
    (tmp_path / "box.toml").write_text(live._box_toml(box))
    b = load_box(tmp_path / "box.toml")
    assert b.gpu_count == 4
    assert b.p2p_time_s(0, 3, 3.6e9) == pytest.approx(2 * 6e-6 + 3.6e9 / 3.6e11)
    no_p2p = dict(GPU, count=4)
    assert live.box_name_or_dict(no_p2p)[1]["gpu"]["count"] == 1   # links unmeasured: a one-GPU box


def test_p2p_table_keeps_gpu_zero(tmp_path):
    recs = [live.Record("gemm", ("bf16", 1, 64, 64), 0.003), live.Record("p2p", (0, 1, 1024), 0.012),
            live.Record("p2p", (0, 1, 1 << 20), 0.03)]
    meta = live.profile_meta(name="p", model_arg="llama-3.1-8b", gpu=GPU, box="h200-1x", params={},
                             param_sources={}, tables=["gemm", "p2p"], reps=3, warmup=1, live={})
    p = load_profile(live._write(tmp_path / "p", meta, recs, [], None))
    assert p.tables["p2p"]["src_gpu"].tolist() == [0, 0]


# ---- the one-line errors ----------------------------------------------------------------

def expect_one_line(capsys, args, needle):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_without_torch_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch -> ImportError
    expect_one_line(capsys, ["calibrate", "live", "--model", "llama-3.1-8b", "--out", str(tmp_path / "p")],
                    "pipesim: error: live calibration needs torch: pip install 'pipesim[live]'")
    assert not (tmp_path / "p").exists()


def test_without_cuda_one_line(monkeypatch, capsys, tmp_path):
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    expect_one_line(capsys, ["calibrate", "live", "--model", "llama-3.1-8b", "--out", str(tmp_path / "p")],
                    "no NVIDIA GPU is visible")


# ---- the harness itself, on the CPU (torch installed) --------------------------------------

@needs_torch
def test_grouped_moe_matches_per_expert_loop_and_reference():
    import torch

    g = torch.Generator().manual_seed(3)
    e, k, h, i, t = 8, 2, 64, 32, 29
    w13 = torch.randn(e, 2 * i, h, generator=g).bfloat16()
    w2 = torch.randn(e, h, i, generator=g).bfloat16()
    x = torch.randn(t, h, generator=g).bfloat16()
    ids_np = live.route(t, e, k, "power_law_1.01", np.random.default_rng(5))
    ids = torch.as_tensor(ids_np)
    gate = torch.rand(t, k, generator=g).bfloat16()
    ref = torch.zeros(t, h)
    for tok in range(t):                                    # the definition, in float32
        for j in range(k):
            we = ids_np[tok, j]
            gu = w13[we].float() @ x[tok].float()
            ref[tok] += gate[tok, j].float() * (w2[we].float() @ (torch.nn.functional.silu(gu[:i]) * gu[i:]))
    loop = live.moe_loop(torch, x, ids, gate, w13, w2, np.bincount(ids_np.ravel(), minlength=e))().float()
    assert ((loop - ref).norm() / ref.norm()).item() < 2e-2
    if live.grouped_mm_fn(torch) is not None:
        grouped = live.moe_grouped(torch, x, ids, gate, w13, w2)().float()
        assert ((grouped - ref).norm() / ref.norm()).item() < 2e-2


@needs_torch
@pytest.mark.parametrize("splits", [1, 4])
def test_split_kv_decode_attention_matches_sdpa(splits):
    import torch

    g = torch.Generator().manual_seed(7)
    b, kv, group, d, ctx = 3, 2, 4, 32, 64
    q, k, v = (torch.randn(*shape, generator=g) for shape in ((b, kv, group, d), (b, kv, ctx, d), (b, kv, ctx, d)))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out = live.split_kv_attention(torch, q.bfloat16(), k.bfloat16(), v.bfloat16(), d ** -0.5, splits)()
    assert out.shape == ref.shape and ((out.float() - ref).norm() / ref.norm()).item() < 2e-2
    # MLA: one latent KV head, values a strided view of the first columns of the cache
    cache = torch.randn(b, 1, ctx, d + 8, generator=g)
    qm = torch.randn(b, 1, 16, d + 8, generator=g)
    ref = torch.softmax(qm @ cache.transpose(-1, -2) * 0.1, -1) @ cache[..., :d]
    out = live.split_kv_attention(torch, qm.bfloat16(), cache.bfloat16(), cache.bfloat16()[..., :d], 0.1, splits)()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2


@pytest.fixture
def tiny_moe(tmp_path):
    cfg = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
           "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 4096}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@needs_torch
def test_run_live_on_cpu_writes_a_loadable_profile(tmp_path, tiny_moe):
    path = live.run_live(tiny_moe, tmp_path / "prof", reps=3, warmup=1, grids=TINY_GRIDS, device="cpu",
                         budget_s=120)
    p = load_profile(path)
    assert set(p.tables) == {"gemm", "gqa_decode", "gqa_prefill", "moe"}
    specs = live.plan_specs(load_model(tiny_moe), TINY_GRIDS)
    for table, df in p.tables.items():
        assert len(df) == sum(1 for s in specs if s.table == table)   # every planned shape, tp 2 included
    assert set(p.tables["moe"]["distribution"]) == {"balanced", "power_law_1.01"}
    assert p.params.moe_distribution == "power_law_1.01" and p.params.kernel_floor_us > 0
    assert p.params.eager_launch_us_per_layer > 0
    assert p.meta["live"]["stage"] == "complete" and p.meta["live"]["skipped_optional"] == 0
    extras = pd.read_csv(path / "live_extras.csv")
    assert {"sampling", "plain_layer_launch", "graph_loop_floor"} <= set(extras["op"])


@needs_torch
def test_budget_skips_optional_extras_only(tmp_path, tiny_moe):
    path = live.run_live(tiny_moe, tmp_path / "prof", reps=3, warmup=1, device="cpu", budget_s=0.001,
                         grids=TINY_GRIDS)
    p = load_profile(path)
    specs = live.plan_specs(load_model(tiny_moe), TINY_GRIDS)
    assert p.meta["live"]["skipped_optional"] == sum(1 for s in specs if not s.required) > 0
    assert set(p.tables["moe"]["moe_tp"]) == {1}              # the tp=2 slices were optional
    assert len(p.tables["gemm"]) == sum(1 for s in specs if s.table == "gemm" and s.required)


@needs_torch
def test_collectives_and_p2p_with_gloo(tmp_path):
    records, note = live.measure_comm(2, TINY_GRIDS, reps=2, warmup=1, limit_s=120, backend="gloo")
    assert note == "complete"
    keys = {(r.table,) + tuple(r.key) for r in records}
    for nbytes in (1024, 4096):
        assert ("collectives", "all_reduce", "gloo", 2, nbytes) in keys
        assert ("collectives", "all_gather", "gloo", 2, nbytes) in keys
        assert ("p2p", 0, 1, nbytes) in keys
    assert all(r.latency_ms > 0 for r in records)


@needs_transformers
def test_hf_model_from_config_and_decode_step(tmp_path):
    import torch

    cfg = {"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "eos_token_id": 2,
           "_source": "ignored"}
    model = live.build_hf_model(cfg, torch.device("cpu"), layers=1)
    assert model.config.num_hidden_layers == 1 and next(model.parameters()).dtype == torch.bfloat16
    assert live.generate_once_s(model, 2, 5, 4) > 0          # exactly 4 tokens, or it raises
    wall, kern = live.hf_step(model, 1, 5, short=1, long=3, repeats=1, with_kernels=False)
    assert wall > 0 and kern is None
    with pytest.raises(live.UserError, match="model_type"):
        live.build_hf_model({"num_hidden_layers": 1}, torch.device("cpu"))


# ---- the H200 cross-check script ------------------------------------------------------------

@pytest.mark.skipif(not AIC_H200.is_dir(), reason="AIConfigurator H200 tables not present")
def test_crosscheck_against_aiconfigurator(tmp_path):
    spec = importlib.util.spec_from_file_location("crosscheck", REPO / "calibration" / "crosscheck_h200.py")
    xc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(xc)
    ref = xc.reference_profile(AIC_H200)
    aic = ref.tables
    gemm = aic["gemm"][(aic["gemm"]["dtype"] == "bf16") & (aic["gemm"]["n"] == 4096) & (aic["gemm"]["k"] == 4096)]
    exact = gemm[gemm["m"].isin([1, 4096])]
    between = gemm[gemm["m"] == 64].assign(m=100)             # AIConfigurator has 97 and 112, not 100
    dec = aic["gqa_decode"]
    dec = dec[(dec["heads_per_gpu"] == 32) & (dec["kv_heads_per_gpu"] == 8) & (dec["head_dim"] == 128)
              & (dec["batch"] == 16) & (dec["context"] == 1023)].assign(latency_ms=lambda d: 2 * d["latency_ms"])
    meta = {"name": "x", "box": "h200-1x", "engine": "sglang"}
    live.write_profile(tmp_path / "m", meta, {"gemm": pd.concat([exact, between]), "gqa_decode": dec})
    rows = xc.compare(load_profile(tmp_path / "m"), ref)
    by = {(r.op, r.shape): r for r in rows.itertuples()}
    assert by[("gemm", "m=1 n=4096 k=4096")].ratio == pytest.approx(1.0)
    assert by[("gemm", "m=1 n=4096 k=4096")].match == "exact"
    assert by[("gemm", "m=100 n=4096 k=4096")].match == "interp"
    assert by[("gqa_decode", "heads_per_gpu=32 kv_heads_per_gpu=8 head_dim=128 batch=16 context=1023")].ratio == \
        pytest.approx(2.0)
    s = xc.summary(rows).set_index("op")
    assert s.loc["gqa_decode", "median_ratio"] == pytest.approx(2.0) and s.loc["gemm", "shapes"] == 3


# ---- fault cases -------------------------------------------------------------------------

@needs_torch
def test_a_failing_operation_mid_run_keeps_the_rest(tmp_path, tiny_moe, monkeypatch):
    """A GPU error in one operation (here: every MoE kernel raises, as an out-of-memory
    or an illegal access would) is logged and skipped; every other table is written."""
    real_build = live._Ops.build

    def build(self, spec):
        if spec.table == "moe":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_build(self, spec)

    monkeypatch.setattr(live._Ops, "build", build)
    path = live.run_live(tiny_moe, tmp_path / "prof", reps=3, warmup=1, device="cpu", grids=TINY_GRIDS)
    p = load_profile(path)
    specs = live.plan_specs(load_model(tiny_moe), TINY_GRIDS)
    assert "moe" not in p.tables and "gemm" in p.tables
    assert p.meta["live"]["failed"] == sum(1 for s in specs if s.table == "moe")


@needs_torch
def test_a_peer_that_never_finishes_is_cut_at_the_limit(tmp_path):
    """Ranks that hang (here: a limit far too short for the run) are stopped within
    the limit; the call returns what was written and says why it stopped."""
    t = time.monotonic()
    records, note = live.measure_comm(2, TINY_GRIDS, reps=2000, warmup=1, limit_s=1.0, backend="gloo")
    assert time.monotonic() - t < 30
    assert note.startswith("cut at the") or note.startswith("failed")
    assert all(r.latency_ms > 0 for r in records)

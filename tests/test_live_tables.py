"""Live calibration, records into a profile that predict reads: tables, extras,
metadata and the box written beside it (no GPU needed)."""

import json

import numpy as np
import pytest

from pipesim.base.toml import dumps
from pipesim.calibrate.live import specs, tables
from pipesim.cli import main
from pipesim.costs.primitives import Shape
from pipesim.costs.stage import CostModel
from pipesim.inputs.box import load_box
from pipesim.inputs.model import load_model
from pipesim.inputs.plan import Plan
from pipesim.profiles.bounds import link_bytes, work
from pipesim.profiles.curves import TABLE_PROVENANCE
from pipesim.profiles.profile import load_profile
from pipesim.profiles.tables import TABLE_COLUMNS

GPU = {
    "name": "NVIDIA H200",
    "count": 1,
    "driver": "580.159.03",
    "torch": "2.11.0",
    "cuda": "13.0",
    "capability": 9.0,
    "sm_count": 132,
    "memory_bytes": 150754820096,
    "l2_bytes": 62914560,
    "copy_bw_bytes_s": 4.3e12,
    "bf16_flops": 7.9e14,
    "date": "2026-12-02",
}


def fake_latency(spec: specs.Spec) -> float:
    """A made-up but shape-dependent latency (ms), distinct per key, that physics allows
    (profiles/bounds.py): twice the roofline of the row's work at the H200's datasheet
    rates (989 TFLOP/s, 4.8 TB/s; a collective: 100 GB/s) plus 10 us."""
    if spec.table not in TABLE_COLUMNS:  # an extra (sampling, launch costs): no table, any value
        return 0.002 + 1e-3 * float(np.log2(1 + np.prod([float(v) for v in spec.key if isinstance(v, int)])))
    cols = {c: np.array([v]) for c, v in zip(TABLE_COLUMNS[spec.table], spec.key)}
    if spec.table == "collectives":
        seconds = float(link_bytes(cols)[0]) / 1e11
    else:
        flops, _, most = work(spec.table, cols)
        seconds = max(float(flops[0]) / 989e12, float(most[0]) / 4.8e12)
    return (2.0 * seconds + 10e-6) * 1e3


def synthetic_records(model):
    return [
        specs.Record(s.table, s.key, fake_latency(s), "graph") for s in specs.plan_specs(model) if s.required
    ]


def write_synthetic(tmp_path, model_arg="llama-3.1-8b", gpu=GPU):
    model = load_model(model_arg)
    records = synthetic_records(model)
    box_name, box = tables.box_name_or_dict(gpu)
    meta = tables.profile_meta(
        name="synthetic",
        model_arg=model_arg,
        gpu=gpu,
        box=box_name,
        params={
            "cpu_iteration_ms": 1.5,
            "eager_launch_us_per_layer": 300.0,
            "kernel_floor_us": 2.0,
            "not_a_param": 1.0,
        },
        param_sources={"cpu_iteration_ms": "measured"},
        tables=sorted({r.table for r in records if r.table in TABLE_COLUMNS}),
        reps=30,
        warmup=5,
        live={"stage": "complete"},
    )
    return tables.write_live_profile(tmp_path / "prof", meta, records, [], box), records


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_profile_covers_every_table_lookup_at_tp1(tmp_path, name):
    # the point of the plan: every GEMM, attention and MoE cost at TP1 comes from a measured row
    path, _ = write_synthetic(tmp_path, name)
    profile = load_profile(path)
    model = load_model(name)
    cm = CostModel(load_box("h200-1x"), model, Plan(1, 1, (model.num_layers,)), profile)
    ops = cm.stage_ops(0, Shape(decode=8, decode_ctx=1000, prefill=((300, 0),)))
    looked_up = [
        o
        for o in ops
        if "proj" in o.name
        or "mlp" in o.name
        and "act" not in o.name
        or o.name in ("lm_head", "router gate", "routed experts", "attention decode", "attention prefill")
    ]
    assert {o.name for o in looked_up} >= {
        "qkv proj",
        "o proj",
        "lm_head",
        "attention decode",
        "attention prefill",
    }
    assert all(o.source in TABLE_PROVENANCE for o in looked_up), [
        (o.name, o.source) for o in looked_up if o.source not in TABLE_PROVENANCE
    ]


# ---- records -> tables -> profile ---------------------------------------------------------


def test_tables_from_records_schema_median_and_order():
    recs = [
        specs.Record("gemm", ("bf16", 8, 4096, 4096), 0.03),
        specs.Record("gemm", ("bf16", 1, 4096, 4096), 0.02),
        specs.Record("gemm", ("bf16", 1, 4096, 4096), 0.04),
        specs.Record("gemm", ("bf16", 1, 4096, 4096), 0.05),
        specs.Record("gemm", ("bf16", 2, 4096, 4096), 0.0),  # a timer artefact: dropped
        specs.Record("gqa_decode", (32, 8, 128, 1, 64), 0.011),
        specs.Record("sampling", ("greedy", 4), 0.006),
    ]
    t = tables.tables_from_records(recs)
    assert set(t) == {"gemm", "gqa_decode"}
    assert list(t["gemm"].columns) == list(TABLE_COLUMNS["gemm"]) + ["latency_ms"]
    assert t["gemm"]["m"].tolist() == [1, 8]
    assert t["gemm"]["latency_ms"].tolist() == [0.04, 0.03]  # median of 0.02, 0.04, 0.05
    extras = tables.extras_frame(recs, [])
    assert extras.to_dict("records") == [
        {"op": "sampling", "params": "mode=greedy;batch=4", "value": 0.006, "unit": "ms"}
    ]
    with pytest.raises(ValueError):
        tables.tables_from_records([specs.Record("gemm", (8, 4096, 4096), 0.03)])


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
    assert "not_a_param" not in p.meta["params"]  # only parameters the profile format knows
    n_gemm = sum(1 for r in records if r.table == "gemm")
    assert len(p.tables["gemm"]) == n_gemm


def test_predict_cli_reads_a_written_profile(tmp_path, capsys):
    path, _ = write_synthetic(tmp_path)
    main(
        [
            "predict",
            "--profile",
            str(path),
            "--model",
            "llama-3.1-8b",
            "--conc",
            "2",
            "--input-len",
            "64",
            "--output-len",
            "12",
            "--json",
        ]
    )
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
    main(
        [
            "predict",
            "--profile",
            str(path),
            "--model",
            "llama-3.1-8b",
            "--conc",
            "1",
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--json",
        ]
    )
    assert json.loads(capsys.readouterr().out)["scenario"]["gpu"] == "NVIDIA L40S"


def test_multi_gpu_box_is_a_star_at_the_measured_p2p_rate(tmp_path):
    gpu = dict(GPU, count=4, p2p_bw_bytes_s=3.6e11, p2p_latency_us=12.0)
    name, box = tables.box_name_or_dict(gpu)
    assert name == "box.toml" and box["gpu"]["count"] == 4
    (tmp_path / "box.toml").write_text(dumps(box))
    b = load_box(tmp_path / "box.toml")
    assert b.gpu_count == 4
    assert b.p2p_time_s(0, 3, 3.6e9) == pytest.approx(2 * 6e-6 + 3.6e9 / 3.6e11)
    no_p2p = dict(GPU, count=4)
    assert tables.box_name_or_dict(no_p2p)[1]["gpu"]["count"] == 1  # links unmeasured: a one-GPU box


def test_p2p_records_set_the_box_links_not_a_table():
    """P2P is measured for the box's links; the profile has no P2P table (hop costs read the box)."""
    from pipesim.calibrate.live.comm import link_summary

    p2p = [
        specs.Record("p2p", (0, 1, 1024), 0.012),
        specs.Record("p2p", (0, 2, 1024), 0.010),
        specs.Record("p2p", (0, 1, 1 << 20), 0.03),
        specs.Record("p2p", (0, 2, 1 << 20), 0.02),
    ]
    links = link_summary(p2p)
    # the medians of two pairs: (12 + 10) / 2 us at 1 KiB, (2^20 B / 30 us + 2^20 B / 20 us) / 2
    assert links["p2p_latency_us"] == pytest.approx(11.0)
    assert links["p2p_bw_bytes_s"] == pytest.approx((2**20 / 30e-6 + 2**20 / 20e-6) / 2, rel=1e-5)
    assert link_summary([]) == {}
    assert "p2p" not in TABLE_COLUMNS
    with pytest.raises(ValueError, match="neither a profile table"):
        tables.extras_frame(p2p, [])

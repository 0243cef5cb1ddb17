"""Records into a profile: the tables (TABLE_COLUMNS schemas), the extras the schema has
no table for, the box the GPUs were measured as, and profile.toml's metadata. Pure."""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

import pandas as pd

from ...base.toml import dumps
from ...profiles.profile import Params
from ...profiles.tables import TABLE_COLUMNS, sig6
from ...profiles.writing import write_profile
from .specs import Record

# Operations measured as records that have no profile table: their key columns.
EXTRA_KEYS: dict[str, tuple[str, ...]] = {"sampling": ("mode", "batch")}


def tables_from_records(records: list[Record]) -> dict[str, pd.DataFrame]:
    """Profile tables from records: TABLE_COLUMNS schemas, the median of repeated keys,
    6 significant digits, rows sorted by key. Records of other ops are left out (see
    `extras_frame`); non-positive latencies (a timer artefact) are dropped."""
    rows: dict[str, list] = {}
    for r in records:
        if r.table in TABLE_COLUMNS and r.latency_ms > 0 and math.isfinite(r.latency_ms):
            cols = TABLE_COLUMNS[r.table]
            if len(r.key) != len(cols):
                raise ValueError(f"record for {r.table} has key {r.key}, needs {cols}")
            rows.setdefault(r.table, []).append(tuple(r.key) + (r.latency_ms,))
    out = {}
    for table, rs in rows.items():
        keys = list(TABLE_COLUMNS[table])
        df = pd.DataFrame(rs, columns=keys + ["latency_ms"])
        df = df.groupby(keys, as_index=False, sort=True)["latency_ms"].median()
        df["latency_ms"] = df["latency_ms"].map(sig6)
        out[table] = df.sort_values(keys, kind="mergesort").reset_index(drop=True)
    return out


def extras_frame(records: list[Record], extras: list[dict]) -> pd.DataFrame:
    """Measurements the profile schema has no table for (sampling, the HF decode loop),
    long format: op, params ("name=value;..."), value, unit."""
    rows = []
    for r in records:
        if r.table in TABLE_COLUMNS:
            continue
        if r.table not in EXTRA_KEYS:
            raise ValueError(
                f"record of {r.table}: neither a profile table nor a known extra ({', '.join(EXTRA_KEYS)})"
            )
        rows.append(
            {
                "op": r.table,
                "params": ";".join(f"{n}={v}" for n, v in zip(EXTRA_KEYS[r.table], r.key)),
                "value": sig6(r.latency_ms),
                "unit": "ms",
            }
        )
    rows += extras
    return pd.DataFrame(rows, columns=["op", "params", "value", "unit"])


def box_name_or_dict(gpu: dict) -> tuple[str, dict | None]:
    """('h200-1x', None) for one H200 (a shipped preset), else ('box.toml', box) with a
    box written beside the profile: the measured copy bandwidth and bf16 GEMM rate,
    and, with several GPUs, a star of links at the measured P2P bandwidth."""
    count = int(gpu["count"])
    if count == 1 and "H200" in str(gpu["name"]):
        return "h200-1x", None
    bf16 = float(gpu["bf16_flops"])
    fp8 = 2.0 * bf16 if float(gpu.get("capability", 0)) >= 8.9 else bf16
    links = []
    if count > 1 and gpu.get("p2p_bw_bytes_s"):
        links = [
            {
                "child": f"gpu{i}",
                "parent": "fabric",
                "bw_gb_s": round(float(gpu["p2p_bw_bytes_s"]) / 1e9, 3),
                "latency_us": round(float(gpu["p2p_latency_us"]) / 2, 3),
            }
            for i in range(count)
        ]
    else:
        count = 1
    return "box.toml", {
        "name": f"live-{slug(gpu['name'])}-{count}x",
        "description": (
            f"{count} x {gpu['name']} measured by pipesim calibrate live on {gpu['date']}: "
            "copy bandwidth and bf16 GEMM rate measured; fp8 assumed 2x bf16 on compute "
            "capability >= 8.9; links a star at the measured P2P bandwidth"
        ),
        "gpu": {
            "name": str(gpu["name"]),
            "count": count,
            "memory_bytes": int(gpu["memory_bytes"]),
            "mem_bw_bytes_s": float(gpu["copy_bw_bytes_s"]),
            "flops_bf16": bf16,
            "flops_fp8": fp8,
            "flops_fp4": fp8,
        },
        "topology": {"links": links},
    }


def slug(text: str) -> str:
    """Lower-case words joined by '-' (a GPU or model name as part of a profile name)."""
    return "-".join("".join(c if c.isalnum() else " " for c in str(text).lower()).split()) or "gpu"


def profile_meta(
    *,
    name: str,
    model_arg: str,
    gpu: dict,
    box: str,
    params: dict,
    param_sources: dict,
    tables: list[str],
    reps: int,
    warmup: int,
    live: dict,
) -> dict:
    """profile.toml content: what was measured, on what, with what, and how."""
    stamp = (
        f"measured live by pipesim calibrate live on {gpu['name']} ({gpu['date']}), torch {gpu['torch']}, "
        f"CUDA {gpu['cuda']}, driver {gpu['driver']}, median of {reps} reps after {warmup} warm-up"
    )
    how = {
        "gemm": "torch linear (cuBLAS) x[m, k] @ w[n, k]^T in bf16",
        "gqa_decode": (
            "one new token per request over `context` cached tokens, the query heads of each KV head "
            "packed as a query block; the faster of torch scaled_dot_product_attention and a plain-torch "
            "split-KV (flash-decoding) kernel sequence, which fills the GPU at small batch"
        ),
        "gqa_prefill": "torch scaled_dot_product_attention, causal, `batch` prompts of `isl` tokens, no cached prefix",
        "mla_decode": (
            "plain torch absorbed MLA, split-KV: latent queries scored over the latent + rope cache, "
            "softmax, weighted sum over the latent, chunks merged by log-sum-exp (unfused; the absorption "
            "and output GEMMs are the gemm table's kv_b rows, as the cost model composes them)"
        ),
        "mla_prefill": "torch scaled_dot_product_attention, causal, q/k head dim nope+rope, v padded to it",
        "moe": (
            f"routed experts only ({live.get('moe_impl', '')}): token slots sorted by expert, gate_up GEMM, "
            "SiLU x up, down GEMM, rows gathered back and summed with the top-k weights; balanced = uniform random top-k, power_law_1.01 = "
            "expert popularity ~ rank^-1.01, top-k drawn without replacement"
        ),
        "collectives": (
            "torch.distributed NCCL, one process per GPU, groups of the first `gpus` GPUs; all_reduce "
            "of nbytes, all_gather_into_tensor to nbytes in total; the slowest rank's median"
        ),
    }
    timing = (
        "CUDA events; CUDA-graph replay where capture succeeded, else eager; L2 flushed before every "
        "repetition; a GPU sleep kernel ahead of each repetition keeps CPU launch gaps out"
    )
    known = {f.name for f in fields(Params)}
    return {
        "name": name,
        "description": (
            f"{model_arg} operation costs measured live on {gpu['count']} x {gpu['name']}; "
            "scheduling model SGLang; CPU costs from the decode loop (see param_sources)"
        ),
        "box": box,
        "engine": "sglang",
        "engine_version": "",
        "model": model_arg,
        "built_by": "pipesim calibrate live",
        "date": gpu["date"],
        "sources": {
            t: f"{stamp}; {how.get(t, '')}; {timing if t != 'collectives' else 'CUDA events'}" for t in tables
        },
        "params": {k: v for k, v in params.items() if k in known},
        "param_sources": {k: v for k, v in param_sources.items() if k in known},
        "gpu": gpu,
        "live": live,
    }


def write_live_profile(
    out: Path, meta: dict, records: list[Record], extras: list[dict], box: dict | None
) -> Path:
    """Write the profile: its tables, live_extras.csv and, for a box that is not a
    preset, box.toml beside it."""
    tables = tables_from_records(records)
    meta = dict(meta, sources={t: meta["sources"].get(t, "") for t in tables})
    df = extras_frame(records, extras)
    files = {"live_extras.csv": df.to_csv(index=False)} if len(df) else {}
    if box is not None:
        files["box.toml"] = dumps(box)
    return write_profile(out, meta, tables, extra=files)

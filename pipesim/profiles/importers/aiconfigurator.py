"""Derive pipesim's kernel and collective tables from AIConfigurator measurements.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) publishes per-GPU
kernel and collective latencies measured on real boxes. The raw tables stay outside
the project (see ``../shared/reference-data/``); this module turns one system folder
into the few narrow tables the simulator looks up, so a profile can ship its own
derived data and cite the source.

Every returned table has integer key columns, one float ``latency_ms`` column (the
source ``latency`` is already in milliseconds) rounded to 6 significant digits, rows
sorted by the key columns, duplicate keys averaged (the source repeats some
measurements) and rows with missing values dropped.

Unit and layout conclusions, checked against the data:

* Head counts are per GPU everywhere. In ``generation_mla_perf`` and
  ``context_mla_perf`` ``num_heads x tp_size`` is 64 for every row except the
  128-head rows at tp 1 (a 64-head model sharded 1..64 ways, plus a 128-head model
  at TP1), and each ``num_heads`` occurs with a single ``tp_size``: ``num_heads`` is
  what one GPU runs, so ``tp_size`` is dropped. The GQA tables have no TP column
  and time one GPU; shard-only counts such as 3 or 5 query heads over 1 kv head
  (24/8, 40/8) show ``num_heads`` and ``num_key_value_heads`` are per GPU too.
* ``nccl_perf.message_size`` counts elements of ``nccl_dtype``; only ``half`` rows
  are kept, so ``nbytes = 2 * message_size``.
* ``custom_allreduce_perf.message_size`` also counts elements (of
  ``allreduce_dtype`` bfloat16), so ``nbytes = 2 * message_size``. Evidence: on
  both boxes the CUDA-graph custom latency equals NCCL half at the *same*
  message_size once bandwidth-bound (rtx 2 GPUs, 8 M: 0.474 vs 0.474 ms; h200
  8 GPUs, 128 M: 1.053 vs 1.053 ms), where bytes would make it match NCCL at half
  the count; AIConfigurator's ``collect_all_reduce.py`` also builds the tensor with
  ``message_size`` elements. Note: on rtx_pro_6000_server the 4- and 8-GPU "custom"
  rows track NCCL closely, down to NCCL's step at 256 K -> 512 K elements on 8 GPUs:
  over PCIe the engine falls back to NCCL beyond 2 GPUs, so those rows are NCCL.

The two layouts of a system folder (flat and nested) are read by
`aiconfigurator_layout.Layout`, which says which version every table came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from ...base.errors import UserError
from ..tables import sig6
from .aiconfigurator_layout import Layout, NotMeasured, is_nested, version_key

KERNEL_SETS = ("sglang", "vllm")

# Source column -> derived column, per table family (tuples of pairs: immutable).
_GEMM_COLS = (("m", "m"), ("n", "n"), ("k", "k"))
_MOE_COLS = (
    ("hidden_size", "hidden"),
    ("inter_size", "inter"),
    ("topk", "topk"),
    ("num_experts", "experts"),
    ("moe_tp_size", "moe_tp"),
    ("distribution", "distribution"),
    ("num_tokens", "tokens"),
)
_GQA_COLS = (
    ("num_heads", "heads_per_gpu"),
    ("num_key_value_heads", "kv_heads_per_gpu"),
    ("head_dim", "head_dim"),
    ("batch_size", "batch"),
)


def _finish(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Apply the common contract: drop NaN, average duplicate keys, round, sort."""
    df = df[keys + ["latency"]].dropna()
    df = df.groupby(keys, as_index=False, sort=True)[["latency"]].mean()
    df["latency_ms"] = df.pop("latency").map(sig6).astype(float)
    for col in keys:
        if pd.api.types.is_numeric_dtype(df[col]):
            df[col] = df[col].astype("int64")
    return df.sort_values(keys, kind="mergesort").reset_index(drop=True)


def _rename(df: pd.DataFrame, pairs: tuple[tuple[str, str], ...]) -> tuple[pd.DataFrame, list[str]]:
    """Rename source columns to pipesim's names; return the frame and the new keys."""
    mapping = dict(pairs)
    return df.rename(columns=mapping), list(mapping.values())


def _pick_kernels(
    raw: pd.DataFrame, kernels: Mapping[str, tuple[tuple[str, str], ...]], dtype_col: str
) -> pd.DataFrame:
    """For each derived dtype, the rows of the first (kernel_source, source dtype) pair
    in its preference list that the table has, with `dtype` added."""
    pairs = raw["kernel_source"].astype(str).str.cat(raw[dtype_col].astype(str), sep="|")
    present = set(pairs.unique())
    wanted = {}
    for name, prefs in kernels.items():
        for k, d in prefs:
            if f"{k}|{d}" in present:
                wanted[f"{k}|{d}"] = name
                break
    out = raw[pairs.isin(wanted)].copy()
    out["dtype"] = pairs[out.index].map(wanted)
    return out


def _gemm(folder: Layout, vllm: bool) -> pd.DataFrame:
    """Dense GEMM latency in bf16 and in fp8 with plain (not block-wise) scales,
    the kernels behind the engines' bf16 and fp8 linear layers; block-scaled and
    fp4 GEMMs are left out (vLLM labels the plain one ``fp8`` as well)."""
    kernels = (
        {
            "bf16": (("vllm_default", "bfloat16"), ("torch.nn.functional.linear", "bfloat16")),
            "fp8": (("vllm_default", "fp8"), ("CutlassFP8ScaledMMLinearKernel", "fp8")),
        }
        if vllm
        else {
            "bf16": (("sglang_torch_linear", "bfloat16"), ("sglang", "bfloat16")),
            "fp8": (("sglang_sgl_kernel_fp8_scaled_mm", "fp8"), ("sglang", "fp8")),
        }
    )
    df, keys = _rename(_pick_kernels(folder.read("gemm_perf"), kernels, "gemm_dtype"), _GEMM_COLS)
    return _finish(df, ["dtype"] + keys)


def _moe(folder: Layout, vllm: bool, ep: bool = False) -> pd.DataFrame:
    """Fused MoE layer latency of one GPU without expert parallelism (moe_ep_size 1), or
    with `ep` one EP rank's (moe_ep_size 2-8, moe_tp x moe_ep <= 8: the ``moe_ep`` table,
    docs/parallel.md §4).

    fp8 means block-scaled fp8 on both engines, so the two kernel sets agree;
    vLLM's per-tensor ``fp8`` rows are left out."""
    kernels = (
        {
            "int4": (
                ("vllm_marlin_int4_moe", "int4_wo"),
                ("vllm_compressedtensorswna16marlinmoe_marlin_marlinexperts", "int4_wo"),
            ),
            "fp8": (
                ("vllm_fused_moe", "fp8_block"),
                ("vllm_fp8moe_triton_tritonexperts", "fp8_block"),
                ("vllm_fp8moe_flashinfer_cutlass_flashinferexperts", "fp8_block"),
                ("vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmodular", "fp8_block"),
            ),
            "bf16": (
                ("vllm_fused_moe", "bfloat16"),
                ("vllm_unquantizedfusedmoe_triton_tritonexperts", "bfloat16"),
                ("vllm_unquantizedfusedmoe_flashinfer_cutlass_flashinferexperts", "bfloat16"),
            ),
        }
        if vllm
        else {
            "int4": (("sglang_marlin_moe", "int4_wo"),),
            "fp8": (("sglang_fused_moe_triton", "fp8_block"),),
            "bf16": (("sglang_fused_moe_triton", "bfloat16"),),
        }
    )
    raw = folder.read("moe_perf")
    if ep:
        raw = raw[raw["moe_ep_size"].isin((2, 4, 8)) & (raw["moe_tp_size"] * raw["moe_ep_size"] <= 8)]
    else:
        raw = raw[raw["moe_ep_size"] == 1]
    cols = _MOE_COLS[:5] + (("moe_ep_size", "moe_ep"),) + _MOE_COLS[5:] if ep else _MOE_COLS
    df, keys = _rename(_pick_kernels(raw, kernels, "moe_dtype"), cols)
    return _finish(df, ["dtype"] + keys)


def _mla(folder: Layout, stem: str, length_col: str, length_name: str) -> pd.DataFrame:
    """MLA attention kernel (SGLang only), bf16 kv cache; num_heads is per GPU."""
    raw = folder.read(stem)
    raw = raw[(raw["mla_dtype"] == "bfloat16") & (raw["kv_cache_dtype"] == "bfloat16")]
    df = raw.rename(columns={"num_heads": "heads_per_gpu", "batch_size": "batch", length_col: length_name})
    return _finish(df, ["heads_per_gpu", "batch", length_name])


def _gqa(
    folder: Layout, stem: str, preference: tuple[str, ...], length_col: str, length_name: str
) -> pd.DataFrame:
    """GQA attention, bf16 attention and kv cache, full attention, beam 1.

    Per head_dim, the first kernel in `preference` that measured that head_dim is
    kept (the engine's default backend where it applies, else its fallback), so
    each shape has one timing from one backend."""
    raw = folder.read(stem)
    keep = (
        (raw["attn_dtype"] == "bfloat16") & (raw["kv_cache_dtype"] == "bfloat16") & (raw["beam_width"] == 1)
    )
    if "window_size" in raw:  # vLLM's tables lack the column: full attention only
        keep &= raw["window_size"] == 0
    if length_col != "step":  # prefill: no cached prefix
        keep &= raw["step"] == 0
    raw = raw[keep]
    rank = raw["kernel_source"].map({k: i for i, k in enumerate(preference)})
    raw = raw[rank.notna()]
    best = rank[raw.index].groupby(raw["head_dim"]).transform("min")
    raw = raw[rank[raw.index] == best]
    df, keys = _rename(raw, _GQA_COLS + ((length_col, length_name),))
    return _finish(df, keys)


def _collectives(folder: Layout) -> pd.DataFrame:
    """NCCL (half) collectives plus the engine's CUDA-graph custom all-reduce.

    Both sources count message_size in 2-byte elements (see module docstring). A custom
    table without a ``backend`` column names no engine's CUDA-graph kernel: the ones filed
    under SGLang 0.5.6.post2 (H100, H200) and 0.5.9 (L40S) hold TRT-LLM's own all-reduce
    (``framework`` TRTLLM), so none of their rows is taken and NCCL stands alone."""
    nccl = folder.read("nccl_perf")
    nccl = nccl[nccl["nccl_dtype"] == "half"].assign(impl="nccl")
    custom = folder.read("custom_allreduce_perf")
    graphed = custom["backend"].str.endswith("_graph") if "backend" in custom else False
    custom = custom[graphed & (custom["allreduce_dtype"] == "bfloat16")].assign(impl="custom")
    df = pd.concat([nccl, custom], ignore_index=True)
    df = df.rename(columns={"op_name": "op", "num_gpus": "gpus"})
    df["nbytes"] = df["message_size"] * 2
    return _finish(df, ["op", "impl", "gpus", "nbytes"])


def build_tables(
    src_dir: Path, *, kernel_set: str = "sglang", version: str | None = None, versions: dict | None = None
) -> dict[str, pd.DataFrame]:
    """Read one AIConfigurator system folder (flat or nested layout, see the module
    docstring) and return pipesim's derived tables; `versions`, if given, is filled
    with the engine version each table came from (table -> text).

    ``src_dir`` is a system folder such as ``.../aiconfigurator/rtx_pro_6000_server``.
    With ``kernel_set="sglang"`` the result has gemm, moe, moe_ep, mla_decode, mla_prefill,
    gqa_decode, gqa_prefill and collectives (those the system measured, nested).

    With ``kernel_set="vllm"`` the flat layout's tables come from the ``vllm-*``
    subfolder, except NCCL, which is engine-independent and taken from ``src_dir``.
    mla_decode and mla_prefill are left out: vLLM's ``mla_*_module_perf`` time the
    whole MLA module of DeepSeek-V3 (the q/kv/o projection GEMMs included: 0.29 ms at
    128 heads, batch 1, versus 0.017 ms for SGLang's attention kernel alone), a
    different quantity that would double-count GEMMs; SGLang's MLA kernels are not
    substituted because that would mix engines silently.
    """
    src_dir = Path(src_dir)
    if kernel_set not in KERNEL_SETS:
        raise UserError(f"kernel_set {kernel_set!r} unknown; use one of {', '.join(KERNEL_SETS)}")
    if not src_dir.is_dir():
        raise UserError(f"AIConfigurator system folder {src_dir} not found")
    nested = is_nested(src_dir)
    if nested:
        layout = Layout(src_dir, kernel_set, version)
    elif kernel_set == "sglang":
        if version is not None:
            raise UserError(
                f"{src_dir}: a flat folder's SGLang tables name no engine version; "
                "--engine-version picks one in the nested layout or a vllm-<version> subfolder"
            )
        layout = Layout(src_dir, "sglang", flat_kernels=src_dir)
    else:
        subdirs = sorted(p for p in src_dir.glob("vllm-*") if p.is_dir())
        if version is not None:
            found = ", ".join(p.name[len("vllm-") :] for p in subdirs) or "none"
            subdirs = [p for p in subdirs if p.name == f"vllm-{version}"]
            if not subdirs:
                raise UserError(f"{src_dir} has no vllm-{version} subfolder (vLLM versions there: {found})")
        if len(subdirs) != 1:
            raise UserError(
                f"{src_dir} needs exactly one vllm-* subfolder for kernel_set vllm, found {len(subdirs)}"
            )
        layout = Layout(src_dir, "vllm", flat_kernels=subdirs[0])
    if kernel_set == "sglang":
        # H200 has no flashinfer attention rows; SGLang's Hopper default fa3 comes next.
        gqa_pref: tuple[str, ...] = ("flashinfer", "fa3", "triton", "flash_attention")
        parts = {
            "gemm": lambda: _gemm(layout, vllm=False),
            "moe": lambda: _moe(layout, vllm=False),
            "moe_ep": lambda: _moe(layout, vllm=False, ep=True),
            "mla_decode": lambda: _mla(layout, "generation_mla_perf", "step", "context"),
            "mla_prefill": lambda: _mla(layout, "context_mla_perf", "isl", "isl"),
            "gqa_decode": lambda: _gqa(layout, "generation_attention_perf", gqa_pref, "step", "context"),
            "gqa_prefill": lambda: _gqa(layout, "context_attention_perf", gqa_pref, "isl", "isl"),
            "collectives": lambda: _collectives(layout),
        }
    else:
        # With a bf16 kv cache vLLM <= 0.19 measured only flash_attn (flashinfer rows are
        # fp8-kv only); 0.24 names the FlashAttention generation (fa3 on Hopper, fa2 on
        # Ada) and on Blackwell measured FlashInfer's TRT-LLM kernels.
        gqa_pref = (
            "vllm_flashinfer",
            "vllm_flash_attn",
            "vllm_flash_attn_fa3",
            "vllm_flash_attn_fa2",
            "vllm_flashinfer_trtllmdecode",
            "vllm_flashinfer_trtllmprefill",
        )
        parts = {
            "gemm": lambda: _gemm(layout, vllm=True),
            "moe": lambda: _moe(layout, vllm=True),
            "moe_ep": lambda: _moe(layout, vllm=True, ep=True),
            "gqa_decode": lambda: _gqa(layout, "generation_attention_perf", gqa_pref, "step", "context"),
            "gqa_prefill": lambda: _gqa(layout, "context_attention_perf", gqa_pref, "isl", "isl"),
            "collectives": lambda: _collectives(layout),
        }
    tables = {}
    for name, make in parts.items():
        try:
            df = make()
        except NotMeasured:
            if not nested:  # the flat layout holds every table; the nested one what was measured
                raise
            continue
        if len(df):
            tables[name] = df
    if versions is not None:
        stems = {
            "gemm": ("gemm_perf",),
            "moe": ("moe_perf",),
            "moe_ep": ("moe_perf",),
            "mla_decode": ("generation_mla_perf",),
            "mla_prefill": ("context_mla_perf",),
            "gqa_decode": ("generation_attention_perf",),
            "gqa_prefill": ("context_attention_perf",),
            "collectives": ("nccl_perf", "custom_allreduce_perf"),
        }
        for name in tables:
            versions[name] = " + ".join(
                f"{layout.versions[st]} {st}" for st in stems[name] if st in layout.versions
            )
    return tables


def kernel_floor_us(tables: dict[str, pd.DataFrame]) -> float:
    """The shortest kernel measured on this GPU (the smallest GEMM latency: launch +
    tail), the fixed cost of every roofline-estimated kernel; 0 without a GEMM table."""
    return round(float(tables["gemm"]["latency_ms"].min()) * 1e3, 3) if "gemm" in tables else 0.0


def import_profile(
    system_dir: str | Path,
    out: str | Path,
    *,
    kernel_set: str,
    box: str,
    name: str | None = None,
    version: str | None = None,
) -> dict[str, pd.DataFrame]:
    """Write a profile at `out` from one AIConfigurator system folder, measured on `box`;
    returns its tables."""
    from ...base.errors import require
    from ...inputs.box import load_box
    from ..writing import check_profile_out, write_profile

    check_profile_out(out)
    require(Path(system_dir).is_dir(), f"{system_dir} is not a folder of AIConfigurator tables")
    load_box(box)
    versions: dict = {}
    tables = build_tables(Path(system_dir), kernel_set=kernel_set, version=version, versions=versions)
    at = f" at version {version}" if version else ""
    require(
        any(t in tables for t in ("gemm", "moe", "gqa_decode", "mla_decode")),
        f"{system_dir}: no {kernel_set} kernel tables{at}; nothing to import",
    )
    note = (
        f"AIConfigurator tables from {Path(system_dir).name} ({kernel_set} kernels), pipesim calibrate import"
    )
    engine_versions = sorted(
        {v.split()[1] for t, v in versions.items() if v.startswith(kernel_set + " ")}, key=version_key
    )
    meta = {
        "name": name or Path(out).name,
        "box": box,
        "engine": kernel_set,
        "engine_version": engine_versions[-1] if engine_versions else "",
        "built_by": "pipesim calibrate import aiconfigurator",
        "sources": {t: f"{note}: {versions[t]}" if versions.get(t) else note for t in tables},
        "params": {"kernel_floor_us": kernel_floor_us(tables)},
    }
    write_profile(out, meta, tables)
    return tables

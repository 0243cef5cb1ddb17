"""Fit the roofline's efficiency curves (pipesim/roofline.py) on measured GPUs, and
validate them leave-one-GPU-out.

    python calibration/fit_roofline.py     # writes pipesim/data/roofline_fit.json and docs/roofline.md

Data: AIConfigurator's measured kernel tables (aiconfigurator-core, Apache-2.0,
`pipesim[catalogue]`), read by pipesim's own importer (calibrate/importers/
aiconfigurator.py: the same kernels and units a profile uses) for every GPU that has
a box preset naming its `aiconfigurator_system`, both engines (vLLM and SGLang), the
newest version each measured; plus the raw tables beside the project
(../shared/reference-data/aiconfigurator/<system>, flat layout) where present. A
GPU's datasheet rates (bandwidth, tensor rates) come from its box preset: the same
numbers a prediction for that GPU uses.

Per operation class the rows are reduced to (bytes moved, flops, measured seconds)
with the formulas costs.py uses for the same operation, and the four coefficients of
`roofline.Curve` are fitted by least squares on log(predicted / measured), every GPU
given the same total weight in each class (a GPU measured at more shapes or by both
engines does not count more). Then, for every GPU, the same fit without it predicts
its rows: the leave-one-GPU-out error, beside the plain roofline's (datasheet rates,
no latency: what a GPU without tables got before).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from pipesim.costs.primitives import ACT_BYTES, distinct_experts
from pipesim.costs.roofline import FIT_FILE, Curve
from pipesim.inputs.box import GPU, box_names, load_box
from pipesim.inputs.quantization import BF16, FP8_BLOCK, INT4_G32
from pipesim.profiles.catalogue import data_root
from pipesim.profiles.importers.aiconfigurator import build_tables

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RAW = REPO.parent / "shared" / "reference-data" / "aiconfigurator"
MOE_FORMATS = {"bf16": BF16, "fp8": FP8_BLOCK, "int4": INT4_G32}
CLASSES = (
    "memory",
    "gemm_bf16",
    "gemm_fp8",
    "attention_decode",
    "attention_prefill",
    "moe_bf16",
    "moe_fp8",
    "moe_int4",
)
POW2 = {2**i for i in range(0, 17)}
GEMM_NK = {256, 512, 1024, 2048, 4096, 8192, 16384}


@dataclass(frozen=True)
class Rows:
    """One GPU's rows of one operation class."""

    system: str
    op: str
    nbytes: np.ndarray
    flops: np.ndarray
    measured_s: np.ndarray
    bw_bytes_s: float
    flops_s: float


def gpus_by_system() -> dict[str, tuple[str, GPU]]:
    """AIConfigurator system -> (box preset, its GPU), from the box presets."""
    found: dict = {}
    for name in box_names():
        box = load_box(name)
        if box.aiconfigurator_system and box.aiconfigurator_system not in found:
            found[box.aiconfigurator_system] = (name, box.gpu)
    return found


def sources(systems: list[str] | None = None) -> list[tuple[str, str, Path]]:
    """(system, engine, folder) for every measured table set found: the catalogue's,
    then the raw flat tables beside the project."""
    out = []
    root = data_root()
    want = systems or sorted(gpus_by_system())
    for system in want:
        if root is not None and (root / system).is_dir() and any((root / system).iterdir()):
            out += [(system, engine, root / system) for engine in ("vllm", "sglang")]
        if (RAW / system).is_dir():
            out.append((system, "sglang", RAW / system))
            if any((RAW / system).glob("vllm-*")):
                out.append((system, "vllm", RAW / system))
    return out


def _take(df: pd.DataFrame, cap: int) -> pd.DataFrame:
    """At most `cap` rows, evenly spaced (deterministic)."""
    return df if len(df) <= cap else df.iloc[np.linspace(0, len(df) - 1, cap).astype(int)]


def class_rows(tables: dict, cap: int) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, str]]:
    """op class -> (bytes, flops, measured seconds, math dtype), costs.py's formulas."""
    out: dict = {}
    if "gemm" in tables:
        g = tables["gemm"]
        g = g[g.m.isin(POW2) & g.n.isin(GEMM_NK) & g.k.isin(GEMM_NK)]
        for dtype, bpp in (("bf16", 2.0), ("fp8", 1.0)):
            d = _take(g[g.dtype == dtype], cap)
            m, n, k = (d[c].to_numpy(float) for c in "mnk")
            nbytes = n * k * bpp + ACT_BYTES * (m * k + m * n)  # costs.CostModel.gemm
            out[f"gemm_{dtype}"] = (nbytes, 2.0 * m * n * k, d.latency_ms.to_numpy() * 1e-3, dtype)
            if dtype == "bf16":  # weight-read bound: the memory class
                d = g[(g.dtype == "bf16") & (g.m <= 16)]
                d = _take(d, cap)
                m, n, k = (d[c].to_numpy(float) for c in "mnk")
                nbytes = n * k * bpp + ACT_BYTES * (m * k + m * n)
                out["memory"] = (nbytes, np.zeros_like(nbytes), d.latency_ms.to_numpy() * 1e-3, "bf16")
    if "gqa_decode" in tables:
        d = tables["gqa_decode"]
        d = _take(d[d.batch.isin(POW2) & (d.context >= 63)], cap)
        b, ctx, h, kvh, hd = (
            d[c].to_numpy(float)
            for c in ("batch", "context", "heads_per_gpu", "kv_heads_per_gpu", "head_dim")
        )
        nbytes = b * ctx * 2 * kvh * hd * ACT_BYTES  # costs.CostModel.attention_decode (bf16 cache)
        out["attention_decode"] = (nbytes, 4.0 * b * h * ctx * hd, d.latency_ms.to_numpy() * 1e-3, "bf16")
    if "gqa_prefill" in tables:
        d = tables["gqa_prefill"]
        d = _take(d[d.isl >= 16], cap)
        b, s, h, hd = (d[c].to_numpy(float) for c in ("batch", "isl", "heads_per_gpu", "head_dim"))
        nbytes = b * ACT_BYTES * s * h * hd * 3  # costs.CostModel.attention_prefill (hidden / tp = h x hd)
        flops = b * 2.0 * h * s * (s / 2.0) * 2 * hd
        out["attention_prefill"] = (nbytes, flops, d.latency_ms.to_numpy() * 1e-3, "bf16")
    if "moe" in tables:
        mo = tables["moe"]
        mo = mo[(mo.distribution == "balanced") & mo.tokens.isin(POW2)]
        for dtype, fmt in MOE_FORMATS.items():
            d = _take(mo[mo.dtype == dtype], cap)
            if not len(d):
                continue
            t, h, inter, topk, e, tp = (
                d[c].to_numpy(float) for c in ("tokens", "hidden", "inter", "topk", "experts", "moe_tp")
            )
            params = 3 * h * inter  # model.Model.expert_params
            touched = distinct_experts(t, e, topk)
            nbytes = (
                touched * params * fmt.bytes_per_param / tp + ACT_BYTES * t * h * 2
            )  # costs.CostModel.moe
            flops = 2.0 * t * topk * params / tp
            out[f"moe_{dtype}"] = (nbytes, flops, d.latency_ms.to_numpy() * 1e-3, fmt.compute)
    return out


def load_rows(systems: list[str] | None = None, cap: int = 1500) -> tuple[list[Rows], dict]:
    """Every GPU's rows by class, and what was read (system -> [engine and versions])."""
    gpus = gpus_by_system()
    merged: dict = {}
    read: dict = {}
    for system, engine, folder in sources(systems):
        versions: dict = {}
        tables = build_tables(folder, kernel_set=engine, versions=versions)
        if folder.parent == data_root():
            what = f"aiconfigurator-core {engine} " + ", ".join(
                sorted({v.split(" ")[1] for t, v in versions.items() if t != "collectives"})
            )
            read.setdefault(system, []).append(what)
        else:
            sub = next(iter(folder.glob("vllm-*")), None) if engine == "vllm" else None
            read.setdefault(system, []).append(
                f"reference-data {folder.name}{'/' + sub.name if sub else ''} ({engine})"
            )
        for op, (nbytes, flops, seconds, dtype) in class_rows(tables, cap).items():
            merged.setdefault((system, op, dtype), []).append((nbytes, flops, seconds))
    rows = []
    for (system, op, dtype), parts in sorted(merged.items()):
        gpu = gpus[system][1]
        nbytes, flops, seconds = (np.concatenate([p[i] for p in parts]) for i in range(3))
        keep = seconds > 0
        if not keep.any():
            continue
        rows.append(
            Rows(system, op, nbytes[keep], flops[keep], seconds[keep], gpu.mem_bw_bytes_s, gpu.flops(dtype))
        )
    return rows, read


def _curve(theta: np.ndarray) -> Curve:
    lat_us, mem, math_, p = theta
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))
    return Curve(math.exp(lat_us) * 1e-6, sig(mem), sig(math_), 1.0 + math.exp(p))


def predict(curve: Curve, r: Rows) -> np.ndarray:
    t_mem = r.nbytes / (curve.mem_eff * r.bw_bytes_s)
    t_math = r.flops / (curve.math_eff * r.flops_s)
    top = np.maximum(np.maximum(t_mem, t_math), 1e-30)
    p = curve.sharpness
    return curve.latency_s + top * ((t_mem / top) ** p + (t_math / top) ** p) ** (1.0 / p)


def plain_roofline(r: Rows) -> np.ndarray:
    """What a GPU without tables got before: datasheet rates, no latency (costs.py)."""
    return np.maximum(r.nbytes / r.bw_bytes_s, r.flops / r.flops_s)


def fit_class(rows: list[Rows]) -> Curve:
    """Least squares on log(predicted / measured), each GPU weighted equally."""
    weights = [np.full(len(r.measured_s), 1.0 / math.sqrt(len(r.measured_s))) for r in rows]
    memory_only = all(not r.flops.any() for r in rows)

    def residuals(theta):
        if memory_only:
            theta = np.array([theta[0], theta[1], 0.0, 5.0])
        c = _curve(theta)
        return np.concatenate([w * np.log(predict(c, r) / r.measured_s) for w, r in zip(weights, rows)])

    x0 = np.array([math.log(5.0), 1.0]) if memory_only else np.array([math.log(5.0), 1.0, 0.5, 0.0])
    got = least_squares(residuals, x0, loss="soft_l1", f_scale=0.2, max_nfev=400)
    theta = np.array([got.x[0], got.x[1], 0.0, 5.0]) if memory_only else got.x
    return _curve(theta)


def abs_pct(pred: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(pred / measured - 1.0) * 100.0


def error_stats(pred: np.ndarray, r: Rows) -> dict:
    e = abs_pct(pred, r.measured_s)
    return {
        "median_ratio": round(float(np.median(pred / r.measured_s)), 3),
        "rows": int(len(e)),
        "median_abs_pct": round(float(np.median(e)), 1),
        "mean_abs_pct": round(float(e.mean()), 1),
    }


def fit_all(rows: list[Rows]) -> dict[str, Curve]:
    by_op: dict = {}
    for r in rows:
        by_op.setdefault(r.op, []).append(r)
    return {op: fit_class(rs) for op, rs in sorted(by_op.items())}


# Measured GPUs of one die with other memory: the test of fitting one and costing the other
SAME_DIE = (("h100_sxm", "h200_sxm"), ("h200_sxm", "h100_sxm"))  # GH100: HBM3 3.35 / HBM3e 4.8 TB/s


def per_gpu(rows: list[Rows], system: str) -> tuple[dict[str, Curve], dict[str, dict]]:
    """The curves fitted on one GPU's rows alone, and their in-sample errors by class."""
    own = [r for r in rows if r.system == system]
    curves = fit_all(own)
    return curves, {r.op: error_stats(predict(curves[r.op], r), r) for r in own}


def same_die(rows: list[Rows], fitted_on: str, costed: str) -> dict[str, dict]:
    """`costed`'s rows predicted at its own datasheet rates by the curves of `fitted_on` (the
    same die) alone, beside those fitted on every other GPU (its leave-one-out)."""
    die, _ = per_gpu(rows, fitted_on)
    others = fit_all([r for r in rows if r.system != costed])
    return {
        r.op: {
            "same_die": error_stats(predict(die[r.op], r), r),
            "others": error_stats(predict(others[r.op], r), r),
        }
        for r in rows
        if r.system == costed and r.op in die and r.op in others
    }


def leave_one_out(rows: list[Rows], held_out: str) -> dict[str, dict]:
    """Fit without `held_out`, predict its rows: op class -> error stats (fitted and plain)."""
    curves = fit_all([r for r in rows if r.system != held_out])
    out = {}
    for r in rows:
        if r.system == held_out and r.op in curves:
            out[r.op] = {
                "fitted": error_stats(predict(curves[r.op], r), r),
                "plain": error_stats(plain_roofline(r), r),
            }
    return out


def render(doc: dict) -> str:
    systems = sorted(doc["leave_one_out"])
    lines = [
        "# The first-principles path, calibrated: fitted roofline",
        "",
        "Generated by `python calibration/fit_roofline.py` (do not edit by hand); the coefficients",
        "it fits are `pipesim/data/roofline_fit.json`, read by `pipesim/roofline.py`.",
        "",
        "A GPU without a measured table (an L4, an H100 PCIe, an A30, a user's own card) is costed",
        "by the roofline on its box's datasheet rates. Each operation class has a curve",
        "",
        "    t = latency + (t_mem^p + t_math^p)^(1/p),",
        "    t_mem = bytes / (mem_eff x bandwidth),  t_math = flops / (math_eff x tensor rate)",
        "",
        "fitted on the measured kernel tables of the GPUs below; costs from it are tagged",
        "`roofline (fitted)` in a prediction's provenance (a profile with measured tables keeps",
        "its own measured kernel floor for what its tables lack: plain `roofline`).",
        "",
        "## Fitted on",
        "",
        "| GPU (AIConfigurator system) | box preset (datasheet rates) | tables |",
        "|---|---|---|",
    ]
    for system in systems:
        lines.append(f"| {system} | {doc['boxes'][system]} | {' / '.join(doc['read'][system])} |")
    lines += [
        "",
        "## Coefficients (fit on every GPU above)",
        "",
        "| class | latency (us) | mem_eff | math_eff | p | rows | in-sample median / mean abs % |",
        "|---|---|---|---|---|---|---|",
    ]
    for op, c in doc["curves"].items():
        res = doc["residuals"][op]
        rows = sum(v["rows"] for v in res.values())
        med = np.median([v["median_abs_pct"] for v in res.values()])
        mean = np.mean([v["mean_abs_pct"] for v in res.values()])
        math_, p = (
            ("-", "-") if op == "memory" else (f"{c['math_eff']:.3f}", f"{c['sharpness']:.2f}")
        )  # bytes only
        lines.append(
            f"| {op} | {c['latency_us']:.2f} | {c['mem_eff']:.3f} | {math_} | {p} | {rows} | {med:.1f} / {mean:.1f} |"
        )
    lines += [
        "",
        "Operation classes: `memory` = norms, activations, rope, sampling (bytes only), fitted on",
        "the weight-read-bound bf16 GEMMs (m <= 16); `gemm_*` by math dtype (GEMM m, n, k in powers",
        "of two, n and k 256-16384); `attention_decode` / `attention_prefill`: GQA attention, bf16 KV",
        "cache (MLA uses the same curves); `moe_*` by weight format: the fused MoE layer, balanced",
        "routing, bytes from the expected distinct experts (costs.py).",
        "",
        "## Leave-one-GPU-out",
        "",
        "Each GPU's rows predicted by the curves fitted on the other GPUs only: median / mean",
        "absolute error in %, beside the plain roofline (datasheet rates, no latency: what a GPU",
        "without tables got before).",
        "",
        "| held-out GPU | class | rows | fitted: median / mean abs % | fitted: median predicted / measured "
        "| plain roofline: median / mean abs % |",
        "|---|---|---|---|---|---|",
    ]
    for system in systems:
        for op, v in doc["leave_one_out"][system].items():
            f, p = v["fitted"], v["plain"]
            lines.append(
                f"| {system} | {op} | {f['rows']} | {f['median_abs_pct']:.1f} / {f['mean_abs_pct']:.1f} "
                f"| {f['median_ratio']:.2f} | {p['median_abs_pct']:.1f} / {p['mean_abs_pct']:.1f} |"
            )
    lines += ["", "## Summary by class (median over held-out GPUs of their median abs %)", ""]
    lines += ["| class | fitted | plain roofline |", "|---|---|---|"]
    for op in doc["curves"]:
        got = [doc["leave_one_out"][s][op] for s in systems if op in doc["leave_one_out"][s]]
        if got:
            f = np.median([g["fitted"]["median_abs_pct"] for g in got])
            p = np.median([g["plain"]["median_abs_pct"] for g in got])
            lines.append(f"| {op} | {f:.1f} | {p:.1f} |")
    lines += [
        "",
        "## Per GPU, for a GPU of the same die (`same_die_as`)",
        "",
        "A box whose GPU was not measured but shares its die with one that was (an A100 40 GB and",
        "the A100 80 GB measured; an H20 and the H100) names that system as `same_die_as`",
        "(docs/boxes.md): its kernels go through the curves fitted on that GPU's tables alone, at",
        "the box's own datasheet bandwidth and tensor rates, so what the die does beyond its",
        "datasheet (the per-GPU bias above) carries over and only what differs, differs.",
        "Not for the L40S's die (AD102: L40, RTX 6000 Ada): its own curves reach the bound of",
        "full datasheet bandwidth (mem_eff 1.0), fitted mostly on benchmark shapes whose weights",
        "stay in its 96 MB L2, while a decode GEMV over a large weight matrix reaches about 76%",
        "(16384 x 4096 bf16 at m = 1: 204 us); those boxes take the curves of every measured GPU.",
        "In-sample median / mean absolute error in % of each GPU's own curves:",
        "",
        "| GPU | " + " | ".join(doc["curves"]) + " |",
        "|---|" + "---|" * len(doc["curves"]),
    ]
    for system in systems:
        res = doc["per_gpu_residuals"][system]
        cells = [
            f"{res[op]['median_abs_pct']:.1f} / {res[op]['mean_abs_pct']:.1f}" if op in res else "-"
            for op in doc["curves"]
        ]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "The test of the transfer, on the two measured GPUs of one die with different memory",
        "(GH100: H100 SXM with 3.35 TB/s of HBM3, H200 with 4.8 TB/s of HBM3e): each one's rows",
        "costed by the other's curves at its own datasheet rates, beside the curves fitted on",
        "every other GPU (its leave-one-out above). Median / mean absolute error in %:",
        "",
        "| curves of -> costed GPU | class | rows | same die | every other GPU |",
        "|---|---|---|---|---|",
    ]
    for pair, by_op in doc["same_die"].items():
        for op, v in by_op.items():
            d, o = v["same_die"], v["others"]
            lines.append(
                f"| {pair} | {op} | {d['rows']} | {d['median_abs_pct']:.1f} / {d['mean_abs_pct']:.1f} "
                f"| {o['median_abs_pct']:.1f} / {o['mean_abs_pct']:.1f} |"
            )
    lines += [
        "",
        "## What the curves do not capture",
        "",
        "- One curve per class for every GPU: what differs between GPUs beyond their datasheet",
        "  bandwidth and tensor rates (cache sizes, launch latency, which attention kernel the",
        "  engine runs there: FlashAttention 3 on Hopper, FlashAttention 2 or FlashInfer elsewhere)",
        "  shows as a bias per GPU, the `median predicted / measured` column above: the GDDR,",
        "  PCIe cards (L40S, RTX PRO 6000) run faster than the curves say (ratios above 1), the",
        "  A100 slower, and B200 attention reaches less of its datasheet rate than Hopper's does.",
        "  An L4 (GDDR6, Ada) most resembles the L40S held out above.",
        "- Small shapes are latency-bound and partly served from cache in these benchmarks",
        "  (repeated runs of the same kernel), which no bytes-over-bandwidth term sees.",
        "- Only kernels are fitted here: collectives on a GPU without tables are NCCL's own model,",
        "  calibrated on measured fabrics by calibration/fit_collectives.py (docs/collectives.md), and",
        "  CPU costs, which the profile parameters carry, are not here.",
        "- The curves replace the roofline only for a profile with no measured kernel at all; a",
        "  GPU with tables uses them (and its own measured kernel floor for the rest).",
    ]
    return "\n".join(lines) + "\n"


def build(systems: list[str] | None = None, cap: int = 1500) -> dict:
    rows, read = load_rows(systems, cap)
    curves = fit_all(rows)
    present = sorted({r.system for r in rows})
    boxes = {s: gpus_by_system()[s][0] for s in present}
    fits = {s: per_gpu(rows, s) for s in present}
    return {
        "source": (
            "fitted by calibration/fit_roofline.py on AIConfigurator's measured kernel tables "
            f"(aiconfigurator-core, Apache-2.0) of {', '.join(present)}; docs/roofline.md"
        ),
        "formula": "t = latency + ((bytes/(mem_eff*bw))^p + (flops/(math_eff*rate))^p)^(1/p)",
        "curves": {op: c.as_dict() for op, c in curves.items()},
        "boxes": boxes,
        "read": read,
        "residuals": {
            op: {r.system: error_stats(predict(c, r), r) for r in rows if r.op == op}
            for op, c in curves.items()
        },
        "leave_one_out": {s: leave_one_out(rows, s) for s in present},
        "per_gpu": {s: {op: c.as_dict() for op, c in fits[s][0].items()} for s in present},
        "per_gpu_residuals": {s: fits[s][1] for s in present},
        "same_die": {
            f"{a} -> {b}": same_die(rows, a, b) for a, b in SAME_DIE if a in present and b in present
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "pipesim" / "data" / FIT_FILE))
    parser.add_argument("--doc", default=str(REPO / "docs" / "roofline.md"))
    parser.add_argument("--rows", type=int, default=1500, help="at most this many rows per table and class")
    args = parser.parse_args()
    doc = build(cap=args.rows)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    Path(args.doc).write_text(render(doc))
    print(f"wrote {args.out} and {args.doc}")


if __name__ == "__main__":
    main()

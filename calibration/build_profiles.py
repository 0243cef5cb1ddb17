"""Build the calibration profiles pipesim ships, from measured tables.

    python calibration/build_profiles.py [--source ../shared/reference-data/aiconfigurator]

Every number in a shipped profile comes from this script: derived tables from
AIConfigurator's silicon database (Apache-2.0) measured on a real 8 x RTX PRO 6000
Blackwell Server box, plus parameters computed here from those tables. Nothing is
edited by hand; rerunning the script reproduces the files byte for byte.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from pipesim.importers.aiconfigurator import build_tables
from pipesim.profile import write_profile

HERE = Path(__file__).resolve().parent
SOURCE_NOTE = ("AIConfigurator silicon database (github.com/ai-dynamo/aiconfigurator, Apache-2.0, "
               "commit 095f58a51c4c), system {system}, {kernels} kernels; derived by "
               "pipesim.importers.aiconfigurator")


def kernel_floor_us(tables: dict) -> float:
    """The shortest kernel measured on this GPU (a tiny GEMM: launch + tail), used as the
    fixed cost of every roofline-estimated kernel."""
    return round(float(tables["gemm"]["latency_ms"].min()) * 1e3, 3)


def build_healthy(source: Path, out: Path) -> None:
    system = "rtx_pro_6000_server"
    tables = build_tables(source / system, kernel_set="sglang")
    note = SOURCE_NOTE.format(system=system, kernels="SGLang 0.5.14")
    meta = {
        "name": "rtx-pro-6000-sglang-healthy",
        "description": ("8 x RTX PRO 6000 Blackwell Server on PCIe with SGLang 0.5.14 kernels and the box's "
                        "measured (healthy) NCCL path. CPU costs are not measured here: they are 0 "
                        "until fitted to end-to-end measurements."),
        "box": "rtx-pro-6000-server-8x",
        "engine": "sglang",
        "engine_version": "0.5.14",
        "built_by": "python calibration/build_profiles.py",
        "sources": {name: note for name in tables},
        "params": {
            "kernel_floor_us": kernel_floor_us(tables),
            "cpu_iteration_ms": 0.0,
            "cpu_hop_ms": 0.0,
            "allreduce_scale": 1.0,
            "allreduce_offset_us": 0.0,
            "moe_distribution": "power_law_1.01",
            "custom_allreduce_max_gpus": 2,
        },
        "param_sources": {
            "kernel_floor_us": "minimum of the gemm table (computed by build_profiles.py)",
            "cpu_iteration_ms": "not measured (neutral 0)",
            "cpu_hop_ms": "not measured (neutral 0)",
            "allreduce_scale": "neutral: the measured NCCL table as is",
            "moe_distribution": "real routing is skewed (REFERENCE section 2): power-law 1.01 rows of the MoE table",
            "custom_allreduce_max_gpus": "SGLang/vLLM use their custom all-reduce only up to 2 PCIe-only GPUs",
        },
    }
    write_profile(out / meta["name"], meta, tables)
    print(f"wrote {out / meta['name']}: " + ", ".join(f"{k} {len(v)} rows" for k, v in tables.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--source", type=Path, default=HERE.parent.parent / "shared" / "reference-data" / "aiconfigurator",
                    help="folder of the AIConfigurator system tables")
    ap.add_argument("--out", type=Path, default=HERE / "profiles")
    args = ap.parse_args()
    build_healthy(args.source, args.out)


if __name__ == "__main__":
    main()

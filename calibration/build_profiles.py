"""Build the calibration profiles pipesim ships, from measured tables and points.

    python calibration/build_profiles.py [--source ../shared/reference-data/aiconfigurator]

Every number in a shipped profile comes from this script: derived tables from
AIConfigurator's silicon database (Apache-2.0) measured on a real 8 x RTX PRO 6000
Blackwell Server box, and parameters fitted by pipesim.calibrate.fit to the reference
deployment's measured points (calibration/reference_points.csv). Nothing is edited by
hand; rerunning the script reproduces the files.

- rtx-pro-6000-sglang-deployment (the default): SGLang 0.5.14 kernel tables, the
  deployment's measured points and launch flags; the host loop of SGLang 0.5.14 as
  measured or cited (pipesim/data/host_loop.toml), on the deployment's CPU
  (host_cpu_factor, fitted to the points, with an all-reduce correction as the rival
  hypothesis);
- rtx-pro-6000-sglang-healthy: the same tables and fitted CPU, the box's measured
  NCCL path as is (no all-reduce correction), SGLang's own default flags;
- rtx-pro-6000-vllm: vLLM 0.19.0 kernel tables of the same box, vLLM's scheduling;
  its host loop from pipesim's defaults for vLLM 0.19 (pipesim/data/host_loop.toml),
  on the same fitted CPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from pipesim.calibrate.fit import fit
from pipesim.profiles.hostloop import with_host_defaults
from pipesim.profiles.importers.aiconfigurator import build_tables, kernel_floor_us
from pipesim.profiles.measured import read_points
from pipesim.profiles.profile import Params, Profile
from pipesim.profiles.tables import Tables
from pipesim.profiles.writing import write_profile

HERE = Path(__file__).resolve().parent
SYSTEM = "rtx_pro_6000_server"
BOX = "rtx-pro-6000-server-8x"
SOURCE = (
    "AIConfigurator silicon database (github.com/ai-dynamo/aiconfigurator, Apache-2.0, commit "
    "095f58a51c4c), system rtx_pro_6000_server, {kernels} kernels; derived by pipesim.importers.aiconfigurator"
)
# Two explanations of the deployment's slow TP8 runs. Both start from the host loop of
# SGLang 0.5.14 as measured or cited (pipesim/data/host_loop.toml: the scheduler, the
# detokenizer and tokenizer manager, the PP hops, the eager launches per kernel) and fit
# the deployment's CPU against the CPU those were timed on (host_cpu_factor): the TP8
# points ran without CUDA graphs, so their launches are the host loop's in either.
HYPOTHESES = {
    "no CUDA graphs: the CPU launch-bound": ["host_cpu_factor"],
    "a slow TP all-reduce path": ["host_cpu_factor", "allreduce_offset_us"],
}
NEUTRAL_AR = {"allreduce_scale": 1.0, "allreduce_offset_us": 0.0}
# the scheduler's CPU per iteration is the host loop's terms (costs/host.py); the profile's
# own extra is none. Before those terms existed it was fitted to ~0 (0.0009 ms).
NO_EXTRA = {
    "cpu_iteration_ms": (
        0.0,
        "none beyond the host loop's terms (costs/host.py: sched, prep, bcast per iteration); "
        "the fit before them gave 0.0009 ms",
    )
}
# the host-loop defaults a fit report lists as held fixed (measured or cited)
HOST_SHOWN = (
    "launch_us_per_kernel",
    "sched_base_us",
    "sched_per_req_us",
    "prep_base_us",
    "prep_per_req_us",
    "tp_bcast_base_us",
    "tp_bcast_per_rank_us",
    "cpu_hop_ms",
    "frontend_ms",
    "detokenize_step_us",
    "detokenize_token_us",
    "stream_step_us",
    "stream_token_us",
)


FIXED_SHOWN = ("kernel_floor_us", "custom_allreduce_max_gpus", *NO_EXTRA)


def base_meta(name: str, description: str, engine: str, version: str, kernels: str, tables: dict) -> dict:
    return {
        "name": name,
        "description": description,
        "box": BOX,
        "engine": engine,
        "engine_version": version,
        "model": "kimi-k2.6",
        "built_by": "python calibration/build_profiles.py",
        "sources": {t: SOURCE.format(kernels=kernels) for t in tables},
        "params": {
            "kernel_floor_us": kernel_floor_us(tables),
            "moe_distribution": "power_law_1.01",
            "custom_allreduce_max_gpus": 2,
        },
        "param_sources": {
            "kernel_floor_us": "minimum of the gemm table (computed by build_profiles.py)",
            "moe_distribution": "real routing is skewed (physics.md §2): the power-law 1.01 rows of the MoE table",
            "custom_allreduce_max_gpus": "SGLang and vLLM use their custom all-reduce only up to 2 PCIe-only GPUs",
        },
    }


def with_no_extra(meta: dict) -> dict:
    """The profile's own scheduler extra: none (NO_EXTRA), with its source."""
    meta["params"].update({k: v for k, (v, _) in NO_EXTRA.items()})
    meta["param_sources"].update({k: src for k, (_, src) in NO_EXTRA.items()})
    return meta


def fit_deployment(tables: Tables, meta: dict, points: list) -> tuple[dict, str, dict]:
    """Fit each hypothesis (the host loop's other terms held at their measured or cited
    defaults); keep the one that predicts the points it was not fitted to best (the
    lowest leave-one-out error; on a tie, the fewer parameters). Returns (params, report,
    fit summary)."""
    base = Profile(
        meta["name"], BOX, "sglang", "0.5.14", Params.from_dict(meta["params"], "build"), meta, tables
    )
    held = with_host_defaults(base, "sglang", "0.5.14")
    results = {h: fit(held, names, points) for h, names in HYPOTHESES.items()}
    # ties (to 0.1 point) go to the hypothesis of fewer free parameters: an all-reduce
    # offset fitted to ~0 explains nothing the CPU alone does not
    best = min(
        results,
        key=lambda h: (round(results[h].loo_mape, 1), round(results[h].mape, 1), len(HYPOTHESES[h])),
    )
    report = [
        "# Fit of rtx-pro-6000-sglang-deployment",
        "",
        "Measured points: calibration/reference_points.csv (physics.md §1).",
        "",
        "## Held fixed: measured or cited, not fitted",
        "",
        "| parameter | value | source |",
        "|---|---|---|",
        *(
            f"| {k} | {meta['params'][k]:g} | {meta['param_sources'][k]} |"
            for k in FIXED_SHOWN
            if k in meta["params"]
        ),
        *(f"| {k} | {getattr(held.params, k):g} | {held.meta['param_sources'][k]} |" for k in HOST_SHOWN),
        "",
        "The host loop's figures are CPU time on the CPU the engines' code was timed on; a prediction "
        "multiplies them by host_cpu_factor, fitted below: this deployment's CPU against that one "
        "(docs/host-loop.md §5.7; the H200 host measured 1.68).",
        "",
    ]
    for h, r in results.items():
        report += [f"## Hypothesis: {h}{'  (kept)' if h == best else ''}", "", r.report(), ""]
    report += [
        "With three points the leave-one-out errors are large where a point alone pins a parameter "
        "(the TP8 C=1 point pins the launches, hence the CPU). Measure more points before trusting "
        "predictions far from them.",
        "",
    ]
    r = results[best]
    summary = {
        "hypothesis": best,
        "params": ", ".join(f"{k}={v:.4g}" for k, v in r.params.items()),
        "mape_pct": round(r.mape, 2),
        "loo_mape_pct": round(r.loo_mape, 2),
        "points": "measured.csv",
        "report": "fit_report.md",
        "loo_error_pct": r.loo_error_pct(),
    }
    return r.params, "\n".join(report), summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument(
        "--source",
        type=Path,
        default=HERE.parent.parent / "shared" / "reference-data" / "aiconfigurator",
        help="folder of the AIConfigurator system tables",
    )
    ap.add_argument("--out", type=Path, default=HERE / "profiles")
    args = ap.parse_args()

    tables = Tables(build_tables(args.source / SYSTEM, kernel_set="sglang"))
    points_df = pd.read_csv(HERE / "reference_points.csv", dtype=str, keep_default_na=False)
    points = read_points(HERE / "reference_points.csv", "calibration/reference_points.csv")

    # the deployment as measured
    meta = base_meta(
        "rtx-pro-6000-sglang-deployment",
        "The reference deployment: Kimi K2.6 on 8 x RTX PRO 6000 Blackwell Server (PCIe) with SGLang "
        "0.5.14 kernels, free parameters fitted to its measured points (physics.md §1).",
        "sglang",
        "0.5.14",
        "SGLang 0.5.14",
        tables,
    )
    meta = with_no_extra(meta)
    params, report, summary = fit_deployment(tables, meta, points)
    meta["params"].update({**NEUTRAL_AR, **params})
    meta["param_sources"].update(
        {k: f"fitted to measured.csv ({summary['hypothesis']}); see fit_report.md" for k in params}
    )
    meta["deployment"] = {
        "max_running_requests": 64,
        "pp_max_micro_batch_size": 64,
        "pp_async_batch_depth": 0,
    }
    meta["deployment_notes"] = {
        "pp_async_batch_depth": "not recorded by the deployment; 0 (SGLang's default) assumed",
        "cuda_graphs": "on (after the CUDA 13 upgrade); the TP8 points ran without them",
    }
    meta["fit"] = summary
    write_profile(args.out / meta["name"], meta, tables, points_df, {"fit_report.md": report})
    print(f"wrote {meta['name']}: {summary}")

    # the same box, healthy NCCL path, SGLang defaults
    healthy = base_meta(
        "rtx-pro-6000-sglang-healthy",
        "8 x RTX PRO 6000 Blackwell Server (PCIe) with SGLang 0.5.14 kernels and the box's measured "
        "NCCL path as is; CPU costs from the deployment's fit; SGLang's default flags.",
        "sglang",
        "0.5.14",
        "SGLang 0.5.14",
        tables,
    )
    healthy = with_no_extra(healthy)
    cpu = {k: v for k, v in params.items() if k == "host_cpu_factor"}
    healthy["params"].update({**NEUTRAL_AR, **cpu})
    healthy["param_sources"].update(
        {
            k: "the box's CPU, fitted to the deployment's points (see rtx-pro-6000-sglang-deployment)"
            for k in cpu
        }
    )
    healthy["param_sources"].update({k: "neutral: the measured NCCL table as is" for k in NEUTRAL_AR})
    write_profile(args.out / healthy["name"], healthy, tables)
    print(f"wrote {healthy['name']}")

    # vLLM 0.19 kernels on the same box
    vtables = build_tables(args.source / SYSTEM, kernel_set="vllm")
    vllm = base_meta(
        "rtx-pro-6000-vllm",
        "8 x RTX PRO 6000 Blackwell Server (PCIe) with vLLM 0.19.0 kernels (GEMM, MoE, GQA attention, "
        "custom all-reduce) and the box's NCCL table. vLLM's MLA tables time whole modules and are not "
        "used: MLA attention is a roofline estimate here. The host loop: vLLM 0.19's defaults "
        "(pipesim/data/host_loop.toml).",
        "vllm",
        "0.19.0",
        "vLLM 0.19.0",
        vtables,
    )
    # the host loop (scheduler, launches, output path) is vLLM's own: the defaults of its
    # release (pipesim/data/host_loop.toml), on this box's CPU (fitted on the deployment)
    vllm["params"].update({**NEUTRAL_AR, **cpu})
    vllm["param_sources"].update(
        {
            k: "the box's CPU, fitted to the SGLang deployment's points (see rtx-pro-6000-sglang-deployment)"
            for k in cpu
        }
    )
    write_profile(args.out / vllm["name"], vllm, vtables)
    print(f"wrote {vllm['name']}: " + ", ".join(f"{k} {len(v)} rows" for k, v in vtables.items()))


if __name__ == "__main__":
    main()

"""The golden scenarios: every headline figure of 26 predictions, kept in
tests/data/golden.json and compared to the float by tests/test_golden.py.

They guard a change that must not move a number (a restructure, a speed-up). A change
that moves numbers on purpose rewrites the file with

    python tests/golden.py --write

and its commit says which figures moved and why. The scenarios span both engines,
TP, PP, TP x PP, DP (replicas and lock step), EP, a cluster of two nodes, open loops,
a trace replay, a tight KV cache, eager launches, other boxes (measured tables and
the roofline) and every what-if knob.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN_FILE = HERE / "data" / "golden.json"
TRACE_FILE = HERE / "data" / "golden_trace.csv"
REPO = HERE.parent
VLLM = dict(engine="vllm", profile="rtx-pro-6000-vllm")
SHORT = dict(input_len=200, output_len=100)

# name -> keyword arguments of pipesim.predict
SCENARIOS: dict[str, dict] = {
    "sglang-tp8-c1": dict(tp=8, conc=1),
    "sglang-tp8-c64": dict(tp=8, conc=64),
    "sglang-pp8-c64": dict(pp=8, conc=64),
    "sglang-tp2pp4-c64": dict(tp=2, pp=4, conc=64),
    "sglang-tp4pp2-c32-intervals": dict(tp=4, pp=2, conc=32, intervals=True),
    "sglang-pp8-depth8-c64": dict(pp=8, conc=64, pp_async_batch_depth=8),
    "sglang-tp8-c512-above-cap": dict(tp=8, conc=512, **SHORT),
    "sglang-pp8-tight-kv": dict(pp=8, conc=64, output_len=400, mem_fraction_static=0.803),
    "sglang-tp8-poisson": dict(tp=8, rate_rps=2.0, num_requests=100),
    "sglang-tp2pp4-poisson-intervals": dict(tp=2, pp=4, rate_rps=1.0, num_requests=80, intervals=True),
    "sglang-tp8-random-lengths": dict(tp=8, conc=32, input_len="100:500", output_len="100:300", seed=3),
    "sglang-tp8-no-cuda-graph": dict(tp=8, conc=8, disable_cuda_graph=True),
    "sglang-dp4-attention-ep8": dict(tp=8, dp=4, dp_attention=True, ep=8, conc=64, **SHORT),
    "sglang-tp8-ep8-power-law": dict(tp=8, ep=8, conc=32, moe_distribution="power_law_1.2", **SHORT),
    "sglang-llama70b-tp4pp2": dict(model="llama-3.1-70b", tp=4, pp=2, conc=16, **SHORT),
    "sglang-llama70b-two-nodes": dict(
        model="llama-3.1-70b", tp=8, pp=2, nodes=2, network="ib-ndr-400", conc=16, **SHORT
    ),
    "sglang-kv-fp8": dict(tp=8, conc=32, kv_cache_dtype="fp8", **SHORT),
    "vllm-tp2pp4-c64": dict(tp=2, pp=4, conc=64, **VLLM),
    "vllm-tp8-c32-eager": dict(tp=8, conc=32, enforce_eager=True, **VLLM, **SHORT),
    "vllm-qwen30b-dp2-ep2": dict(
        model="qwen3-30b-a3b", tp=1, dp=2, enable_expert_parallel=True, conc=64, **VLLM, **SHORT
    ),
    "vllm-llama8b-trace": dict(model="llama-3.1-8b", tp=2, trace=str(TRACE_FILE), **VLLM),
    "whatif-kernel-scale": dict(tp=8, conc=32, kernel_scale=0.5, **SHORT),
    "whatif-allreduce-pcie": dict(
        tp=4, pp=2, conc=32, allreduce_scale=2.0, pcie_bandwidth_scale=0.5, **SHORT
    ),
    "whatif-cpu-iteration": dict(pp=8, conc=32, cpu_iteration_ms=1.0, **SHORT),
    "box-h100-measured-tables": dict(box="h100-sxm-8x", model="llama-3.1-70b", tp=4, conc=32, **SHORT),
    "box-l4-roofline": dict(box="l4-8x", model="llama-3.1-8b", tp=2, conc=8, **SHORT),
}

# fields of Result that are not figures of the prediction (wall time) or are kept as digests
SKIP = ("sim_wall_s", "request_columns", "stage_columns", "requests", "stages")


def _plain(v: object) -> object:
    """JSON-ready, every float at full precision (repr round-trips); a path inside the
    repository relative to it (the file must not depend on where the checkout is)."""
    if isinstance(v, str) and v.startswith(str(REPO) + "/"):
        return Path(v).relative_to(REPO).as_posix()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else repr(f)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.ndarray):
        return _plain(v.tolist())
    return v


def _moments(columns: dict) -> dict:
    """Per column of the per-request or per-stage rows: its length, sum and sum of
    squares (a changed value moves them; unlike a digest they allow the last bit of a
    sum to differ on another CPU, test_golden.RTOL)."""
    out = {}
    for name in sorted(columns):
        a = np.asarray(columns[name], dtype=float)
        a = a[np.isfinite(a)]
        out[name] = [len(a), float(a.sum()), float((a * a).sum())]
    return out


def figures(result: object) -> dict:
    """Every figure of a Result (the scenario's description included), at full precision."""
    out = {k: _plain(v) for k, v in vars(result).items() if k not in SKIP}
    workload = out["scenario"]["workload"]
    if "trace" in workload:  # the file as named from tests/, not where this checkout lies
        workload["trace"] = Path(workload["trace"]).resolve().relative_to(HERE).as_posix()
    out["request_columns"] = _moments(result.request_columns)
    out["stage_columns"] = _moments(result.stage_columns)
    return out


def compute(name: str) -> dict:
    """The figures of one scenario; the trace replay's path as the checkout names it
    (relative to its root), so that the file is the same in every checkout."""
    import pipesim

    out = figures(pipesim.predict(**{"intervals": False, **SCENARIOS[name]}))
    workload = out["scenario"]["workload"]
    if workload.get("trace") == str(TRACE_FILE):
        workload["trace"] = TRACE_FILE.relative_to(HERE.parent).as_posix()
    return out


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    golden = {}
    for name in SCENARIOS:
        golden[name] = compute(name)
        print(name, golden[name]["output_throughput_tok_s"])
    GOLDEN_FILE.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN_FILE}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    raise SystemExit(main(sys.argv[1:]))

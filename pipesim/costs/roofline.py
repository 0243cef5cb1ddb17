"""The first-principles path, calibrated: roofline costs with efficiency curves fitted
on the GPUs that were measured.

A GPU without a measured table (an L4, an H100 PCIe, a user's own card) is costed from
its datasheet rates. The plain roofline, max(bytes / bandwidth, flops / tensor rate),
assumes every kernel reaches the datasheet; measured kernels do not, least of all small
ones. Here each operation class has a curve

    t = latency + (t_mem^p + t_math^p)^(1/p),
    t_mem = bytes / (mem_eff x bandwidth),  t_math = flops / (math_eff x tensor rate)

a constant latency per kernel, the achieved share of memory bandwidth and of the tensor
rate, and a soft maximum whose sharpness p says how abruptly a kernel turns from
memory-bound to compute-bound (p -> infinity is the plain max). The coefficients are
fitted by calibration/fit_roofline.py on AIConfigurator's measured tables of several
GPUs (aiconfigurator-core, Apache-2.0) and shipped as pipesim/data/roofline_fit.json,
with their sources, residuals and a leave-one-GPU-out validation (docs/roofline.md).

A GPU that was not measured but shares its die with one that was (an A100 40 GB and the
A100 80 GB, an L40 and the L40S: the box's `same_die_as`) takes the curves fitted on that
GPU's tables alone (`shipped_fit(system)`), at its own datasheet rates: what the die does
beyond its datasheet carries over, and only what differs (memory, clocks) differs.

Operation classes: `memory` (norms, activations, rope, sampling: bytes only; fitted on
the weight-read-bound GEMMs, m <= 16), `gemm_<dtype>` by the GEMM's math dtype,
`attention_decode`, `attention_prefill`, `moe_<weight kernel>`. A class the fit lacks
falls back to its family's bf16 curve, then to `memory`'s latency and bandwidth share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

FIT_FILE = "roofline_fit.json"
PROVENANCE_FITTED = "roofline (fitted)"


@dataclass(frozen=True)
class Curve:
    """One operation class's efficiency curve (the module docstring's formula)."""

    latency_s: float
    mem_eff: float
    math_eff: float
    sharpness: float

    def seconds(self, nbytes: float, flops: float, bw_bytes_s: float, flops_s: float) -> float:
        t_mem = nbytes / (self.mem_eff * bw_bytes_s)
        t_math = flops / (self.math_eff * flops_s) if flops > 0 else 0.0
        p = self.sharpness
        top = max(t_mem, t_math)
        if top <= 0.0:
            return self.latency_s
        # (a^p + b^p)^(1/p) written to stay finite for large p
        return self.latency_s + top * ((t_mem / top) ** p + (t_math / top) ** p) ** (1.0 / p)

    def as_dict(self) -> dict:
        return {
            "latency_us": round(self.latency_s * 1e6, 4),
            "mem_eff": round(self.mem_eff, 4),
            "math_eff": round(self.math_eff, 4),
            "sharpness": round(self.sharpness, 4),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Curve:
        return cls(data["latency_us"] * 1e-6, data["mem_eff"], data["math_eff"], data["sharpness"])


@dataclass(frozen=True)
class FittedRoofline:
    """The fitted curves by operation class, and where they came from."""

    curves: tuple[tuple[str, Curve], ...]
    source: str  # one line: what the curves were fitted on

    def curve(self, op: str) -> Curve:
        found = dict(self.curves)
        family = op.split("_")[0]
        for name in (op, f"{family}_bf16", f"{family}_decode" if family == "attention" else ""):
            if name in found:
                return found[name]
        memory = found["memory"]
        return Curve(memory.latency_s, memory.mem_eff, 1.0, 1.0e3)

    def seconds(self, op: str, nbytes: float, flops: float, bw_bytes_s: float, flops_s: float) -> float:
        return self.curve(op).seconds(nbytes, flops, bw_bytes_s, flops_s)


def fit_from_dict(data: dict) -> FittedRoofline:
    curves = tuple((name, Curve.from_dict(c)) for name, c in sorted(data["curves"].items()))
    return FittedRoofline(curves, data.get("source", ""))


@lru_cache(maxsize=1)
def _shipped_doc() -> dict | None:
    path = resources.files("pipesim.data") / FIT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


@lru_cache(maxsize=16)
def shipped_fit(system: str = "") -> FittedRoofline | None:
    """The coefficients shipped with pipesim (None if the file is absent): fitted on every
    measured GPU, or with `system` on that AIConfigurator system's tables alone (None if
    it was not fitted)."""
    doc = _shipped_doc()
    if doc is None or not system:
        return fit_from_dict(doc) if doc else None
    curves = doc.get("per_gpu", {}).get(system)
    if curves is None:
        return None
    source = f"fitted by calibration/fit_roofline.py on AIConfigurator's measured {system} tables alone"
    return fit_from_dict({"curves": curves, "source": source})

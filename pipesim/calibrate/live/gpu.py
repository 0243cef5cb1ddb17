"""The GPUs being measured: name, count, versions, and two measured ceilings (copy
bandwidth and the bf16 GEMM rate) that a box written beside the profile uses."""

from __future__ import annotations

import datetime as dt
from types import ModuleType

from ...profiles.tables import sig6
from .timing import Bench, Factory, Timed


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # NVML missing: ask nvidia-smi
        pass
    import subprocess

    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe_gpu(torch: ModuleType, bench: Bench) -> dict:
    """Name, count, versions and two measured ceilings of the visible GPUs (on a CPU
    device, for tests: stated placeholders, nothing measured)."""
    dev = bench.device
    if not bench.cuda:
        return {
            "name": "cpu",
            "count": 1,
            "driver": "none",
            "torch": torch.__version__,
            "cuda": "none",
            "capability": 0.0,
            "sm_count": 0,
            "memory_bytes": 2**34,
            "l2_bytes": 0,
            "copy_bw_bytes_s": 1e10,
            "bf16_flops": 1e11,
            "date": dt.date.today().isoformat(),
        }
    props = torch.cuda.get_device_properties(dev)

    def timed(make: Factory) -> float:
        ms, _ = bench.time_ms(make, graph=False, reps=10)
        torch.cuda.empty_cache()
        return ms

    def copy() -> Timed:
        src = torch.empty(2**30 // 2, dtype=torch.bfloat16, device=dev).normal_()
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    def matmul() -> Timed:
        a, b = (torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) for _ in range(2))
        return lambda: a @ b

    copy_ms, mm_ms = timed(copy), timed(matmul)
    return {
        "name": torch.cuda.get_device_name(dev),
        "count": torch.cuda.device_count(),
        "driver": _driver_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "capability": float(f"{props.major}.{props.minor}"),
        "sm_count": int(props.multi_processor_count),
        "memory_bytes": int(props.total_memory),
        "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
        "copy_bw_bytes_s": sig6(2 * 2**30 / (copy_ms * 1e-3)),  # read + write
        "bf16_flops": sig6(2 * 8192**3 / (mm_ms * 1e-3)),
        "date": dt.date.today().isoformat(),
    }

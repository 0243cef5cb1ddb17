"""Live calibration: measure a model's operation costs on the NVIDIA GPUs of this machine
(see `run` for the run, `timing` for how an operation is timed)."""

from .run import run_live

__all__ = ["run_live"]

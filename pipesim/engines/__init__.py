"""Engines: their knobs (as frozen values) and their schedulers (SimPy processes).

`ENGINES` maps an engine name to its config class; the scheduler that forms
micro-batches the way that engine does lives in the module named for it.
"""

from .sglang import SGLangConfig
from .vllm import VLLMConfig

ENGINES = {"sglang": SGLangConfig, "vllm": VLLMConfig}

__all__ = ["ENGINES", "SGLangConfig", "VLLMConfig"]

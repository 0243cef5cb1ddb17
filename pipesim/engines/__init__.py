"""Engines: their knobs (as frozen values) and their schedulers (SimPy processes).

`ENGINES` maps an engine name to its config class (`protocol.EngineConfig`), whose
fields are its knobs, each declared once (`knobs.py`); the scheduler that forms
micro-batches the way that engine does lives in the module named for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .sglang import SGLangConfig
from .vllm import VLLMConfig

if TYPE_CHECKING:
    from .protocol import EngineConfig

ENGINES: dict[str, type[EngineConfig]] = {"sglang": SGLangConfig, "vllm": VLLMConfig}

__all__ = ["ENGINES", "SGLangConfig", "VLLMConfig"]

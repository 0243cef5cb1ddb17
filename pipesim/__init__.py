"""pipesim: a discrete-event simulator of pipeline bubbles and all-reduce cost in LLM
inference engines, for any TP x PP split and concurrency.

The public names are imported on first use, so `import pipesim` (and `pipesim --help`)
does not load pandas or the simulator.
"""

from __future__ import annotations

import importlib

# public name -> the module that owns it
_EXPORTS = {
    "predict": "api",
    "run": "api",
    "sweep": "explore.sweep",
    "search": "explore.search",
    "build_scenario": "scenario.build",
    "Scenario": "scenario.build",
    "Result": "measure.metrics",
    "UserError": "base.errors",
    "whatif": "api",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """A public name, imported from the module that owns it on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipesim' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

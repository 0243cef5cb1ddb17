"""pipesim: a discrete-event simulator of pipeline bubbles and all-reduce cost in LLM
inference engines, for any TP x PP split and concurrency.

The public names are imported on first use, so `import pipesim` (and `pipesim --help`)
does not load pandas or the simulator.
"""

from __future__ import annotations

import importlib
import sys
import types

# public name -> the module that owns it
_EXPORTS = {
    "predict": "api",
    "run": "api",
    "sweep": "sweep",
    "search": "search",
    "build_scenario": "scenario",
    "Scenario": "scenario",
    "Result": "metrics",
    "UserError": "errors",
    "whatif": "api",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"


class _Package(types.ModuleType):
    """`pipesim.sweep` and `pipesim.search` are the functions, though modules of the same
    names exist: importing a submodule binds its name on the package, and that binding
    is declined here for the exported names, so the function is found instead."""

    def __getattr__(self, name: str) -> object:
        if name not in _EXPORTS:
            raise AttributeError(f"module 'pipesim' has no attribute '{name}'")
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        super().__setattr__(name, value)
        return value

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_EXPORTS))


sys.modules[__name__].__class__ = _Package

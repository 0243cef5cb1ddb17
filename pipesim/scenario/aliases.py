"""The same names in Python as on the command line: a scenario's keywords under the
names `pipesim predict` takes (--conc, --rate) and the engines' own (vLLM's
--tensor-parallel-size, SGLang's --tp-size, bench_serving's --max-concurrency, ...),
so `pipesim.predict(rate=2, tensor_parallel_size=8)` is
`pipesim.predict(rate_rps=2, tp=8)`, as the command line's flags are one option.

`with_aliases` rewrites a keyword-only function's aliases to their names before the
call. An alias and its name both given with different values is one clear line; a
name left at its default gives way to its alias.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from ..base.errors import UserError

# alias -> the keyword it means (the command line's spellings as Python names)
ALIASES = {
    "conc": "concurrency",
    "max_concurrency": "concurrency",
    "rate": "rate_rps",
    "request_rate": "rate_rps",
    "tensor_parallel_size": "tp",
    "tp_size": "tp",
    "pipeline_parallel_size": "pp",
    "pp_size": "pp",
    "data_parallel_size": "dp",
    "dp_size": "dp",
    "ep_size": "ep",
    "expert_parallel_size": "ep",
    "enable_dp_attention": "dp_attention",
    "all2all_backend": "moe_a2a_backend",
}

P = ParamSpec("P")
R = TypeVar("R")


def canonical(kwargs: dict[str, Any], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """`kwargs` with every alias under the name it means. A name given too, with another
    value than its alias's and not its default, is refused (one UserError line)."""
    out = dict(kwargs)
    defaults = defaults or {}
    for alias, name in ALIASES.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if name in out and out[name] != value and out[name] != defaults.get(name, None):
            raise UserError(f"{alias}={value!r} and {name}={out[name]!r} name one setting; give one of them")
        out[name] = value
    return out


def with_aliases(f: Callable[P, R]) -> Callable[P, R]:
    """`f` (keyword-only) accepting ALIASES for its keywords."""
    defaults = {
        k: p.default
        for k, p in inspect.signature(f).parameters.items()
        if p.default is not inspect.Parameter.empty
    }

    @functools.wraps(f)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return f(*args, **canonical(kwargs, defaults))

    return call

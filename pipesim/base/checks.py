"""Checks shared by every entry point: the stated limits on a run's size, and readers
of user values and files that turn every bad one into one `UserError` line.

The limits keep a run's time and memory bounded before any work starts; each is
listed in docs/bad-input.md with the way round it.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, TypeGuard

from .errors import UserError, require

MAX_GPUS = 65_536  # tp, pp, a sweep's GPU count, a box's or cluster's GPUs
MAX_CONCURRENCY = 65_536  # closed-loop clients
MAX_RUNNING = 65_536  # max-running-requests, max-num-seqs, micro-batch and CUDA-graph caps
MAX_BATCH_TOKENS = 2**24  # chunked-prefill-size, max-prefill-tokens, max-num-batched-tokens
MAX_ASYNC_DEPTH = 64  # pp-async-batch-depth: extra micro-batch slots
MAX_REQUESTS = 1_000_000  # --num-requests of an open loop
MAX_TRACE_ROWS = 1_000_000  # rows of a replayed trace
MAX_LAYERS = 4096  # a model's decoder layers
MAX_CONFIG_SIZE = 2**31  # any other size in a model config (hidden, heads, vocab, context, ...)
MAX_WORKERS = 1024  # sweep worker processes
MAX_SIMULATE = 32  # the plans a two-stage search simulates at most, by default (explore/screen.py)
MAX_SEED = 2**63  # numpy seeds are 64-bit
# decode batch steps of one run (requests x output tokens / batch): a simulation runs
# about 4 events a step at 10-50 thousand events a second, so this is a minute or two
MAX_BATCH_STEPS = 500_000
# a sweep: its scenarios (the product of its lists, counted before any is built) and the
# decode batch steps of all of them together: 200 runs at the one-run limit, hours of one core
MAX_SWEEP_SCENARIOS = 100_000
MAX_SWEEP_BATCH_STEPS = 200 * MAX_BATCH_STEPS
MAX_SIM_S = 1e6  # simulated-time horizon: a run stops here whatever its state
MAX_JSON_DEPTH = 200  # nesting of a JSON or TOML file


def is_int(value: object) -> TypeGuard[int]:
    """A whole number given as one: Python or numpy integers, never a bool or a float.
    The guard lets the checker treat it as the int it converts to (a numpy integer
    compares and converts as one); bool is tested first, as typeshed does not make it
    an Integral and the checker would call a test after the Integral one unreachable."""
    return (
        not isinstance(value, bool)
        and isinstance(value, numbers.Integral)
        and type(value).__name__ != "bool_"
    )


def is_number(value: object) -> TypeGuard[float]:
    """A real number (int or float, Python or numpy), never a bool or a string; the
    checker treats it as the float it converts to."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and type(value).__name__ != "bool_"


def whole(value: object, what: str, lo: int = 1, hi: int | None = None) -> int:
    """`value` as an int in [lo, hi]; one line naming `what` otherwise."""
    if not (is_int(value) and int(value) >= lo):
        raise UserError(f"{what} must be a whole number >= {lo}, got {value!r}")
    if hi is not None:
        require(int(value) <= hi, f"{what} {value} is above the limit of {hi}")
    return int(value)


def number(value: object, what: str, lo: float = 0.0, *, above: bool = False) -> float:
    """`value` as a finite float >= lo (> lo when `above`)."""
    if not (
        is_number(value)
        and math.isfinite(float(value))
        and (float(value) > lo if above else float(value) >= lo)
    ):
        raise UserError(f"{what} must be a finite number {'>' if above else '>='} {lo:g}, got {value!r}")
    return float(value)


def flag(value: object, what: str) -> bool | None:
    """An on/off value: True, False or None (unset); never the string 'false'."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    require(
        value is None or isinstance(value, bool) or numpy_bool, f"{what} must be True or False, got {value!r}"
    )
    return None if value is None else bool(value)


def read_text(path: str | Path, what: str) -> str:
    """A text file's content; binary bytes become one line."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {exc.start}); give a text file") from None


def too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether brackets nest deeper than `limit` (strings are not skipped: an over-estimate only
    for brackets inside strings, which no config has at that depth)."""
    d = 0
    for ch in text:
        if ch in "[{":
            d += 1
            if d > limit:
                return True
        elif ch in "]}":
            d -= 1
    return False


def _too_deep(what: str) -> UserError:
    return UserError(f"{what}: nested too deeply (more than {MAX_JSON_DEPTH} levels of [ or {{)")


def parse_json(text: str, what: str) -> Any:
    """JSON text -> object; malformed, too deeply nested or non-finite-looking input is one line."""
    if too_deep(text):
        raise _too_deep(what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise _too_deep(what) from None


def parse_toml(text: str, what: str) -> dict[str, Any]:
    """TOML text -> dict, with the same depth guard as JSON."""
    from .toml import toml_reader

    if too_deep(text):
        raise _too_deep(what)
    try:
        return toml_reader.loads(text)
    except toml_reader.TOMLDecodeError as exc:
        raise UserError(f"{what}: not valid TOML: {exc}") from None
    except RecursionError:
        raise _too_deep(what) from None


def batch_steps(requests: int, output_tokens: int, batch: int) -> float:
    """The decode batch steps a run of `requests` requests of `output_tokens` each takes
    at `batch` requests per step: the size of its simulation."""
    return requests * output_tokens / max(1, batch)


def check_work(steps: float, how: str) -> None:
    """Refuse a run whose estimated work is above MAX_BATCH_STEPS, saying how to go round it."""
    require(
        steps <= MAX_BATCH_STEPS,
        f"this run needs about {steps:,.0f} decode batch steps ({how}), above the limit of "
        f"{MAX_BATCH_STEPS:,} (a minute or two of simulation); use fewer requests, shorter outputs or a "
        "larger concurrency",
    )


def check_sweep_size(combos: int, splits: int, loads: int) -> None:
    """Refuse a sweep of more than MAX_SWEEP_SCENARIOS scenarios, before any is built."""
    n = combos * splits * loads
    require(
        n <= MAX_SWEEP_SCENARIOS,
        f"this sweep has {n:,} scenarios ({combos} box x engine x length combinations x {splits} splits x "
        f"{loads} loads), above the limit of {MAX_SWEEP_SCENARIOS:,}; split it into several sweeps (fewer "
        "values per list), each with its own --out",
    )


def check_sweep_work(steps: float, scenarios: int) -> None:
    """Refuse a sweep whose scenarios together need more than MAX_SWEEP_BATCH_STEPS."""
    require(
        steps <= MAX_SWEEP_BATCH_STEPS,
        f"this sweep's {scenarios:,} scenarios need about {steps:,.0f} decode batch steps together, above the "
        f"limit of {MAX_SWEEP_BATCH_STEPS:,} (hours of simulation); split it into several sweeps (fewer "
        "values per list), each with its own --out, or use shorter outputs",
    )

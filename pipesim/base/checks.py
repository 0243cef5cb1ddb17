"""Checks shared by every entry point: the stated limits on a run's size, and readers
of user values and files that turn every bad one into one `UserError` line.

The limits keep a run's time and memory bounded before any work starts; each is
listed in docs/bad-input.md with the way round it.
"""

from __future__ import annotations

import gzip
import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeGuard

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
# what a file read may hold, counted while it streams in (read_bounded: a file past a bound
# is refused when the bound is crossed, before the rest is read or inflated): a measured
# table 1,000,000 rows and 128 MiB decompressed (14x and 64x the largest shipped, 71,485
# rows in 2 MB), a trace MAX_TRACE_ROWS rows and 128 MiB, a sweep table MAX_SWEEP_SCENARIOS
# rows and 256 MiB, any other text file (configs, box files, benchmark outputs, measured
# points) 64 MiB
MAX_TABLE_ROWS = 1_000_000
MAX_TABLE_BYTES = 128 * 2**20
MAX_TRACE_BYTES = 128 * 2**20
MAX_SWEEP_TABLE_BYTES = 256 * 2**20
MAX_TEXT_BYTES = 64 * 2**20
# a profile's measured points (measured.csv): validate runs one simulation each, fit and
# diagnose many; their work is also counted (scenario/work.py)
MAX_MEASURED_POINTS = 1_000
MAX_BOX_DEPTH = 64  # links from a box's deepest node to the top of its tree (real boxes: under 10)


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


@dataclass(frozen=True)
class Fields:
    """Typed reads of one object of a user's file (a JSON config's section, a TOML table):
    each value of its kind and within its bounds, or one line naming where it is, the key
    and what is allowed. Every field of a user file is read through one of these, so a
    string where a number belongs, a number where a list belongs or a list of the wrong
    length is a UserError, never a TypeError deep inside (and never silently truncated,
    or read as True)."""

    data: Mapping[str, Any]
    where: str

    @classmethod
    def of(cls, data: object, where: str) -> Fields:
        if not isinstance(data, Mapping):
            raise UserError(f"{where} must be a JSON object, got {type(data).__name__}")
        return cls(data, where)

    def _bad(self, key: str, allowed: str) -> UserError:
        return UserError(f"{self.where}: '{key}' = {self.data[key]!r} must be {allowed}")

    def whole(self, key: str, default: int, lo: int = 1, hi: int = MAX_CONFIG_SIZE) -> int:
        """A whole number in [lo, hi] (absent or null: `default`)."""
        v = self.data.get(key)
        if v is None:
            return default
        if not (is_int(v) and lo <= int(v) <= hi):
            raise self._bad(key, f"a whole number from {lo} to {hi}")
        return int(v)

    def flag(self, key: str, default: bool) -> bool:
        """true or false (a JSON boolean; absent or null: `default`)."""
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(key, "true or false")
        return v

    def choice(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        """One of `allowed` (compared in lower case; absent or null: `default`)."""
        v = self.data.get(key)
        if v is None:
            return default
        if not (isinstance(v, str) and v.lower() in allowed):
            raise self._bad(key, f"one of {', '.join(allowed)}")
        return v.lower()

    def names(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        """A list of strings (absent or null: `default`)."""
        v = self.data.get(key)
        if v is None:
            return default
        if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise self._bad(key, "a list of names")
        return tuple(v)

    def wholes(self, key: str, length: int, lo: int = 1, hi: int = MAX_CONFIG_SIZE) -> tuple[int, ...] | None:
        """A list of `length` whole numbers in [lo, hi] (absent or null: None)."""
        v = self.data.get(key)
        if v is None:
            return None
        if not (
            isinstance(v, list) and len(v) == length and all(is_int(x) and lo <= int(x) <= hi for x in v)
        ):
            raise self._bad(key, f"a list of {length} whole numbers from {lo} to {hi}")
        return tuple(int(x) for x in v)

    def section(self, key: str) -> Fields | None:
        """A nested object (absent or null: None)."""
        v = self.data.get(key)
        return None if v is None else Fields.of(v, f"{self.where}.{key}")


def not_empty(**given: object) -> None:
    """Each named value given as text is not empty: an empty value is refused, never read
    as not given (the default in its place)."""
    for key, v in given.items():
        require(
            not (isinstance(v, str) and not v.strip()),
            f"--{key.replace('_', '-')} is empty; give a value, or leave the flag out for the default",
        )


def read_bounded(
    source: str | Path | IO[bytes] | IO[str], origin: str, max_bytes: int, max_rows: int | None = None
) -> bytes:
    """A file's bytes (gunzipped when `origin` ends in .gz), read in chunks and counted as
    they come: past `max_bytes` (after decompression) or `max_rows` lines after the first
    (a header), one line naming the file and the bound, before the rest is read or
    inflated; so a small gzip that inflates to gigabytes, or a huge trace, never takes more
    memory than its bound. (A quoted field with a line break counts as two lines: an
    over-count, never an under-count.) A gzip stream that is not one raises OSError or
    EOFError, for the caller to name. `source`: a path, or an open file (bytes or text)."""
    if isinstance(source, (str, Path)):
        try:
            with open(source, "rb") as fh:
                return read_bounded(fh, origin, max_bytes, max_rows)
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise UserError(f"{origin}: cannot read ({exc.strerror or exc})") from None
    stream: Any = gzip.GzipFile(fileobj=source) if origin.endswith(".gz") else source  # type: ignore[arg-type]
    parts: list[bytes] = []
    size = lines = 0
    while True:
        got: bytes | str = stream.read(1 << 20)
        if not got:
            return b"".join(parts)
        block = got.encode() if isinstance(got, str) else got  # a text stream (a caller's StringIO)
        size += len(block)
        if size > max_bytes:
            packed = " once decompressed" if origin.endswith(".gz") else ""
            raise UserError(
                f"{origin}: more than {max_bytes / 2**20:,.0f} MiB{packed}, above the limit for this "
                "file; stopped reading there (split it, or give the part that matters)"
            )
        if max_rows is not None:
            lines += block.count(b"\n")
            if lines > max_rows + 1:
                raise UserError(
                    f"{origin}: more than {max_rows:,} rows, above the limit of {max_rows:,}; stopped "
                    "reading there (split it, or give the part that matters)"
                )
        parts.append(block)


def read_text(path: str | Path, what: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A text file's content, read within `max_bytes` (read_bounded); binary bytes become
    one line."""
    try:
        text = read_bounded(path, f"{what} {path}", max_bytes).decode("utf-8")
        return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as Path.read_text
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

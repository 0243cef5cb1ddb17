"""A scenario's fingerprint: a SHA-256 of everything that decides its simulation, the
key of its stored results (base/cache.py).

A built scenario is plain values (frozen dataclasses of the box, model, plan, engine,
settings, memory, workload and profile), so its fingerprint is a digest of a canonical
text of those values, field by field: numbers at full precision (repr), dicts sorted by
key, sets sorted, numpy arrays by type, shape and bytes, and a profile's tables by their
own digest (tables.Tables.digest, computed once per loaded profile). Two scenarios built
the same way in two processes have the same fingerprint; any changed value (a knob, a
length, a parameter, one latency in a table) another. A value of a type it does not know
is refused (TypeError) rather than fingerprinted by its identity.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Mapping
from pathlib import PurePath

import numpy as np

from ..profiles.tables import Tables


def fingerprint(value: object) -> str:
    """The SHA-256 (hex) of `value`'s canonical text (a Scenario, or any of its parts)."""
    h = hashlib.sha256()
    _feed(h, value, 0)
    return h.hexdigest()


def _feed(h: hashlib._Hash, v: object, depth: int) -> None:
    if depth > 64:
        raise TypeError("a value nested more than 64 deep: not a scenario's")
    if v is None or isinstance(v, (bool, int, str)):
        h.update(f"{type(v).__name__}:{v!r};".encode())
    elif isinstance(v, float):
        h.update(f"float:{v!r};".encode())
    elif isinstance(v, np.generic):
        _feed(h, v.item(), depth)
    elif isinstance(v, np.ndarray):
        h.update(f"ndarray:{v.dtype.str}:{v.shape}:".encode())
        if v.dtype == object:
            h.update("\0".join(map(repr, v.tolist())).encode())
        else:
            h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, Tables):
        h.update(f"tables:{v.digest};".encode())
    elif isinstance(v, enum.Enum):
        h.update(f"enum:{type(v).__qualname__}.{v.name};".encode())
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        h.update(f"{type(v).__module__}.{type(v).__qualname__}(".encode())
        for f in dataclasses.fields(v):
            h.update(f"{f.name}=".encode())
            _feed(h, getattr(v, f.name), depth + 1)
        h.update(b")")
    elif isinstance(v, Mapping):
        h.update(b"{")
        for key in sorted(v, key=repr):
            _feed(h, key, depth + 1)
            _feed(h, v[key], depth + 1)
        h.update(b"}")
    elif isinstance(v, (list, tuple)):
        h.update(f"{type(v).__name__}[".encode())
        for x in v:
            _feed(h, x, depth + 1)
        h.update(b"]")
    elif isinstance(v, (set, frozenset)):
        h.update(b"set[")
        for x in sorted(v, key=repr):
            _feed(h, x, depth + 1)
        h.update(b"]")
    elif isinstance(v, PurePath):
        h.update(f"path:{v.as_posix()};".encode())
    elif isinstance(v, type):
        h.update(f"type:{v.__module__}.{v.__qualname__};".encode())
    else:
        raise TypeError(f"cannot fingerprint a {type(v).__qualname__}")

"""TOML reading on every supported Python (tomllib is 3.11+), and writing through
tomli-w for the files pipesim writes (profile metadata, a box: tables and arrays of
tables)."""

import sys
from typing import Any

# which branch runs depends on the interpreter; a version test (not a try of the
# import) is what a type checker can follow
if sys.version_info >= (3, 11):  # pragma: no cover
    import tomllib as toml_reader
else:  # pragma: no cover
    import tomli as toml_reader

__all__ = ["toml_reader", "dumps"]


def _plain(v: object, where: str) -> object:
    """`v` in TOML's own types for tomli-w: numpy scalars as Python numbers, tuples as
    lists, a key whose value is None left out (TOML has no null: absent is unset)."""
    if isinstance(v, dict):
        return {str(k): _plain(x, f"{where}.{k}") for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        if any(x is None for x in v):
            raise ValueError(f"{where}: TOML has no null, and a list cannot leave an item out")
        return [_plain(x, where) for x in v]
    if type(v).__module__.split(".")[0] == "numpy" and hasattr(v, "item"):
        return _plain(v.item(), where)
    if isinstance(v, (bool, int, float, str)):
        return v
    return str(v)  # a Path, a date written as text


def dumps(data: dict[str, Any]) -> str:
    """TOML text of a dict (the profile metadata; a box with its array of links),
    written by tomli-w: keys that need quotes quoted (a dotted key is one key), numpy
    numbers as numbers, None left out."""
    import tomli_w

    plain = _plain(data, "toml")
    assert isinstance(plain, dict)  # a dict stays a dict (its keys as text)
    return tomli_w.dumps(plain)

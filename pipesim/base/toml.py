"""TOML reading on every supported Python (tomllib is 3.11+), and a small writer for
the files pipesim writes (profile metadata, a box: tables and arrays of tables)."""

import json
import sys
from typing import Any

# which branch runs depends on the interpreter; a version test (not a try of the
# import) is what a type checker can follow
if sys.version_info >= (3, 11):  # pragma: no cover
    import tomllib as toml_reader
else:  # pragma: no cover
    import tomli as toml_reader

__all__ = ["toml_reader", "dumps"]


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return _string(v)


def _string(v: object) -> str:
    """A TOML basic string: JSON's escapes are TOML's, and non-ASCII text (a "§") is
    written as itself, not as a \\u escape, so the file reads as it was meant."""
    return json.dumps(str(v), ensure_ascii=False)


def _is_table_array(v: object) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _header(path: tuple[str, ...]) -> str:
    return ".".join(
        k if k.replace("_", "").replace("-", "").isalnum() else _string(k) for k in map(str, path)
    )


def _body(data: dict[str, Any], path: tuple[str, ...]) -> list[str]:
    """Key-value lines of one table (keys bare at the top level, quoted inside tables),
    then its sub-tables and arrays of tables."""
    key = (lambda k: k) if not path else _string
    lines = [
        f"{key(k)} = {_value(v)}"
        for k, v in data.items()
        if not isinstance(v, dict) and not _is_table_array(v)
    ]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{_header(path + (k,))}]"] + _body(v, path + (k,))
        elif _is_table_array(v):
            for item in v:
                lines += ["", f"[[{_header(path + (k,))}]]"] + _body(item, path + (k,))
    return lines


def dumps(data: dict[str, Any]) -> str:
    """TOML text for a dict of scalars, lists, dicts and lists of dicts (the profile
    metadata; a box with its array of links)."""
    return "\n".join(_body(data, ())) + "\n"

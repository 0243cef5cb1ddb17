"""TOML reading on every supported Python (tomllib is 3.11+), and a small writer for
the flat files pipesim writes (top-level keys and one level of tables)."""

import json

try:  # pragma: no cover - which branch runs depends on the interpreter
    import tomllib as toml_reader
except ModuleNotFoundError:  # pragma: no cover
    import tomli as toml_reader

__all__ = ["toml_reader", "dumps"]


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def dumps(data: dict) -> str:
    """TOML text for a dict of scalars and dicts of scalars (the profile metadata)."""
    lines = [f"{k} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"] + [f"{json.dumps(str(kk))} = {_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"

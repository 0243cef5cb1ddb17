"""Strict JSON for every `--json`: what a machine reads must parse with any JSON parser.

Python's json writes NaN and Infinity as bare tokens that are not JSON (RFC 8259) and
refuses numpy's scalars; a prediction has both (a TPOT of one-token requests is NaN, a
table's cells are numpy floats). `plain` turns a value into JSON's own types (a number
that is not finite becomes null, numpy scalars and arrays plain numbers and lists, a
pandas Series or DataFrame a dict or a list of records, a tuple or set a list) and
`dumps` writes it refusing anything left over (allow_nan=False).
"""

from __future__ import annotations

import json
import math
from typing import Any


def plain(v: Any) -> Any:
    """`v` in JSON's own types: dict keys as text, NaN and infinities as None."""
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [plain(x) for x in v]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    mod = type(v).__module__.split(".")[0]
    if mod == "numpy":
        if hasattr(v, "tolist"):
            return plain(v.tolist())
    if mod == "pandas":
        if hasattr(v, "to_dict") and hasattr(v, "columns"):
            return plain(v.to_dict("records"))
        if hasattr(v, "to_dict"):
            return plain(v.to_dict())
        return None if str(v) in ("<NA>", "NaT", "nan") else str(v)
    if hasattr(v, "to_dict"):
        return plain(v.to_dict())
    return str(v)


def dumps(v: Any, indent: int | None = 2) -> str:
    """Strict JSON text of `v` (through `plain`)."""
    return json.dumps(plain(v), indent=indent, allow_nan=False)

"""The conditions of a sweep table: the box, engine, input and output lengths its rows
were run under. A table of several (a sweep of lists, or tables put together) holds a
deployment's splits once per condition; splits compare only within one, so the summary,
search and figures take a table condition by condition. A table without these columns,
or with one value in each, is one condition.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .grid import KEY_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pandas as pd

CONDITION_COLUMNS = KEY_COLUMNS[:4]  # box, engine, input_len, output_len
NAMES = {"box": "box", "engine": "engine", "input_len": "input", "output_len": "output"}


def varying(df: pd.DataFrame) -> list[str]:
    """The condition columns that take more than one value in `df` (none: one condition)."""
    return [c for c in CONDITION_COLUMNS if c in df.columns and df[c].astype(str).nunique() > 1]


def conditions(df: pd.DataFrame) -> Iterator[tuple[dict, pd.DataFrame]]:
    """(condition, rows) of each condition, in table order; the condition names only
    the columns that vary ({} for a table of one condition)."""
    cols = varying(df)
    if not cols:
        yield {}, df
        return
    for values, part in df.groupby(cols, sort=False, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        yield dict(zip(cols, values)), part


def condition_text(condition: dict) -> str:
    """'engine vllm, input 300': the values that tell a condition apart."""
    return ", ".join(f"{NAMES[c]} {v}" for c, v in condition.items())


def condition_slug(condition: dict) -> str:
    """A file-name part for a condition: 'engine-vllm_input-300' ('' for none)."""
    return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", f"{NAMES[c]}-{v}") for c, v in condition.items())


def condition_index(df: pd.DataFrame) -> pd.Series:
    """Each row's condition as a number, 0 for the first in table order."""
    import pandas as pd

    cols = varying(df)
    if not cols:
        return pd.Series(0, index=df.index)
    return df.groupby(cols, sort=False, dropna=False).ngroup()

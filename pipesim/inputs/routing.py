"""Routing distributions of a MoE layer's tokens over its experts, as pipesim and
AIConfigurator's MoE tables name them, parsed to one number: the power-law exponent.

- `balanced`: every expert equally likely (exponent 0);
- `power_law_<s>`: expert popularity proportional to j^-s, s > 0 (Zipf); AIConfigurator
  measures s = 1.01 and 1.2 (`power_law_1.01`, `power_law_1.2`).

A name is read as its number, so `power_law_1.20` is `power_law_1.2`; anything else
(`banana`, `power_law_x`, `power_law_-1`) is refused with one line, never read as
balanced. costs/moe.py reads a table between two measured exponents by interpolation.
"""

from __future__ import annotations

import math

from ..base.errors import UserError

MAX_EXPONENT = 100.0  # j^-100: every token on the most popular experts already at s ~ 5
ALLOWED = f"balanced or power_law_S with S a number in (0, {MAX_EXPONENT:g}], e.g. power_law_1.01"


def exponent(name: object, what: str = "routing distribution") -> float:
    """A distribution's power-law exponent (balanced: 0); one line for anything else."""
    if name == "balanced":
        return 0.0
    head, _, tail = str(name).rpartition("_")
    try:
        s = float(tail) if head == "power_law" and isinstance(name, str) else math.nan
    except ValueError:
        s = math.nan
    if not (0.0 < s <= MAX_EXPONENT):  # NaN and inf fail too
        raise UserError(f"{what} {name!r} is not known; allowed: {ALLOWED}")
    return s


def name_of(s: float) -> str:
    """The distribution of exponent s, as the tables name it."""
    return "balanced" if s == 0 else f"power_law_{s:g}"

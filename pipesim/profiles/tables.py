"""A profile's measured tables: their columns (TABLE_COLUMNS), reading and checking one
table file, the parsed-table cache, and the lookups (`Tables`) built from them once.
Tables are read into numpy columns; pandas only where a DataFrame is asked for."""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..base.checks import MAX_TABLE_BYTES, MAX_TABLE_ROWS, read_bounded
from ..base.errors import UserError, require
from ..inputs.quantization import KERNELS
from ..inputs.routing import exponent
from .curves import Curves, Surface, group_curves
from .stored_lookups import stored_lookup

if TYPE_CHECKING:
    from typing import IO

    import pandas as pd

# Key columns of each table (latency_ms is the value). Sizes are per GPU.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "gemm": ("dtype", "m", "n", "k"),
    "moe": ("dtype", "hidden", "inter", "topk", "experts", "moe_tp", "distribution", "tokens"),
    # one rank of an expert-parallel MoE (docs/parallel.md §4): tokens of the whole batch
    "moe_ep": ("dtype", "hidden", "inter", "topk", "experts", "moe_tp", "moe_ep", "distribution", "tokens"),
    "mla_decode": ("heads_per_gpu", "batch", "context"),
    "mla_prefill": ("heads_per_gpu", "batch", "isl"),
    "gqa_decode": ("heads_per_gpu", "kv_heads_per_gpu", "head_dim", "batch", "context"),
    "gqa_prefill": ("heads_per_gpu", "kv_heads_per_gpu", "head_dim", "batch", "isl"),
    "collectives": ("op", "impl", "gpus", "nbytes"),
}
TEXT_COLUMNS = {"dtype", "distribution", "op", "impl"}


def sig6(x: float) -> float:
    """x to 6 significant digits, the precision measured latencies are stored at
    (plenty for timings, and it keeps the tables small)."""
    return float(f"{x:.6g}")


class Tables(Mapping):
    """A profile's tables (name -> DataFrame) and the lookups built from them once.

    Loaded tables are kept as numpy columns (`columns`): the lookups read those, and a
    DataFrame is built only when a table is asked for by name (calibration, reports),
    so a prediction never imports pandas. Kept apart from `Profile` so that a profile
    with other parameters (a what-if, a fit candidate) shares the same indexed tables."""

    def __init__(
        self,
        frames: Mapping | None = None,
        *,
        columns: Mapping[str, dict[str, np.ndarray] | Callable[[], dict[str, np.ndarray]]] | None = None,
        keys: Mapping[str, str] | None = None,
    ):
        """`columns`: per table its numpy columns, or a function that reads them, called
        the first time the table is used (a prediction reads the tables its model uses:
        an MLA model no GQA table, a dense one no MoE table). `keys`: per table a text
        naming its content (a shipped file's name and stamp): a table with a key has
        its lookups stored once built (stored_lookups.py), and read back in the next
        process instead of built again."""
        self._frames = dict(frames or {})
        self._columns = dict(columns or {})
        self._keys = dict(keys or {})

    def __getitem__(self, table: str) -> pd.DataFrame:
        if table not in self._frames:
            if table not in self._columns:
                raise KeyError(table)
            import pandas as pd

            self._frames[table] = pd.DataFrame(self._read(table))
        return self._frames[table]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._frames) | set(self._columns), key=list(TABLE_COLUMNS).index))

    def __len__(self) -> int:
        return len(set(self._frames) | set(self._columns))

    def __contains__(self, table: object) -> bool:
        return table in self._frames or table in self._columns

    def without(self, table: str) -> Tables:
        """The same tables less `table` (a box that sets a measured table aside)."""
        return Tables(
            {k: v for k, v in self._frames.items() if k != table},
            columns={k: v for k, v in self._columns.items() if k != table},
            keys={k: v for k, v in self._keys.items() if k != table},
        )

    def columns(self, table: str) -> dict[str, np.ndarray] | None:
        """The table's columns as numpy arrays (None: the profile has no such table)."""
        if table in self._columns:
            return self._read(table)
        df = self._frames.get(table)
        return None if df is None else {c: df[c].to_numpy() for c in df.columns}

    def _read(self, table: str) -> dict[str, np.ndarray]:
        cols = self._columns[table]
        if callable(cols):
            cols = self._columns[table] = cols()
        return cols

    @cached_property
    def digest(self) -> str:
        """A SHA-256 of every table's columns (names, types, values), computed once per
        object: what a stored result's key holds of the tables (scenario/fingerprint.py)."""
        h = hashlib.sha256()
        for table in self:
            cols = self.columns(table) or {}
            for name in sorted(cols):
                a = np.asarray(cols[name])
                h.update(f"|{table}|{name}|{a.dtype.str}|{a.shape}|".encode())
                if a.dtype == object:
                    h.update("\0".join(map(str, a.tolist())).encode())
                else:
                    h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def _stored(self, table: str, build: Callable[[], dict]) -> dict:
        if table not in self._columns or table not in self._keys:
            return build()
        return stored_lookup(table, self._keys[table], build)

    @cached_property
    def gemm(self) -> dict:
        """dtype -> (ns, ks, {(n, k): Curve over m})."""
        return self._stored("gemm", self._gemm)

    def _gemm(self) -> dict[str, tuple[list[int], list[int], Curves]]:
        out: dict[str, tuple[list[int], list[int], Curves]] = {}
        df = self.columns("gemm")
        if df is None:
            return out
        for (dtype,), part in _groups(df, ("dtype",)):
            curves = group_curves(_keys(part, ("n", "k")), part["m"], part["latency_ms"])
            ns = sorted({n for n, _ in curves})
            ks = sorted({k for _, k in curves})
            out[str(dtype)] = (ns, ks, curves)
        return out

    @cached_property
    def moe(self) -> dict:
        """(dtype, hidden, inter, topk, experts, moe_tp, distribution) -> Curve over tokens."""
        return self._stored(
            "moe", lambda: self._moe_curves("moe", ("hidden", "inter", "topk", "experts", "moe_tp"))
        )

    @cached_property
    def moe_ep(self) -> dict:
        """(dtype, hidden, inter, topk, experts, moe_tp, moe_ep, distribution) -> Curve over tokens."""
        return self._stored(
            "moe_ep",
            lambda: self._moe_curves("moe_ep", ("hidden", "inter", "topk", "experts", "moe_tp", "moe_ep")),
        )

    @cached_property
    def moe_by_routing(self) -> dict:
        """(dtype, hidden, inter, topk, experts, moe_tp) -> {routing exponent: Curve over
        tokens} (inputs/routing.py; costs/routing.py reads between exponents)."""
        return _by_routing(self.moe)

    @cached_property
    def moe_ep_by_routing(self) -> dict:
        """(dtype, hidden, inter, topk, experts, moe_tp, moe_ep) -> {routing exponent: Curve}."""
        return _by_routing(self.moe_ep)

    def _moe_curves(self, table: str, shape_cols: tuple[str, ...]) -> dict:
        df = self.columns(table)
        if df is None:
            return {}
        out = {}
        for (dtype, dist), part in _groups(df, ("dtype", "distribution")):
            shape = _keys(part, shape_cols)
            for key, curve in group_curves(shape, part["tokens"], part["latency_ms"]).items():
                out[(str(dtype),) + key + (str(dist),)] = curve
        return out

    def _surfaces(self, table: str, outer: str, inner: str) -> dict:
        df = self.columns(table)
        if df is None:
            return {}
        keys = [c for c in TABLE_COLUMNS[table] if c not in (outer, inner)]
        curves = group_curves(_keys(df, keys + [outer]), df[inner], df["latency_ms"])
        rows: dict = {}
        for key, curve in curves.items():
            rows.setdefault(key[:-1], {})[float(key[-1])] = curve
        return {k: Surface(v) for k, v in rows.items()}

    @cached_property
    def mla_decode(self) -> dict:
        """(heads_per_gpu,) -> Surface over (batch, context)."""
        return self._stored("mla_decode", lambda: self._surfaces("mla_decode", "batch", "context"))

    @cached_property
    def mla_prefill(self) -> dict:
        """(heads_per_gpu,) -> Surface over (batch, isl)."""
        return self._stored("mla_prefill", lambda: self._surfaces("mla_prefill", "batch", "isl"))

    @cached_property
    def gqa_decode(self) -> dict:
        return self._stored("gqa_decode", lambda: self._surfaces("gqa_decode", "batch", "context"))

    @cached_property
    def gqa_prefill(self) -> dict:
        return self._stored("gqa_prefill", lambda: self._surfaces("gqa_prefill", "batch", "isl"))

    @cached_property
    def collectives(self) -> dict:
        """(op, impl, gpus) -> Curve over nbytes."""
        return self._stored("collectives", self._collectives)

    def _collectives(self) -> dict:
        df = self.columns("collectives")
        if df is None:
            return {}
        out = {}
        for (op, impl), part in _groups(df, ("op", "impl")):
            for (n,), curve in group_curves(
                _keys(part, ("gpus",)), part["nbytes"], part["latency_ms"]
            ).items():
                out[(str(op), str(impl), int(n))] = curve
        return out


def _by_routing(curves: dict) -> dict:
    out: dict = {}
    for key, curve in curves.items():
        out.setdefault(key[:-1], {})[exponent(key[-1])] = curve
    return out


def _keys(cols: dict, names: Iterable[str]) -> np.ndarray:
    return np.column_stack([np.asarray(cols[c]).astype(np.int64) for c in names])


def _groups(cols: dict, by: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], dict[str, np.ndarray]]]:
    """(key, columns of its rows in table order) per distinct value of the `by`
    columns, keys sorted (as a DataFrame groupby)."""
    # each column's distinct values sorted (as strings) and each row's rank among them;
    # the ranks combined in column order sort the keys as tuples of strings do
    texts = [np.asarray(cols[c]).astype(str) for c in by]
    code = np.zeros(len(texts[0]), dtype=np.int64)
    for t in texts:
        u, inv = np.unique(t, return_inverse=True)
        code = code * len(u) + inv.reshape(-1)
    order = np.argsort(code, kind="stable")  # table order within a key
    for idx in np.split(order, np.flatnonzero(np.diff(code[order])) + 1) if len(order) else ():
        key = tuple(str(t[idx[0]]) for t in texts)
        yield key, {c: np.asarray(v)[idx] for c, v in cols.items()}


# the enumerated text columns and the values each may hold (a value pipesim does not know
# would never be read: an operation silently priced by the roofline instead)
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")
NAMES = {"dtype": KERNELS, "op": COLLECTIVE_OPS}


def _check_names(texts: list[str], column: str, origin: str) -> None:
    """Every cell of an enumerated column one of its values (`distribution`: a routing
    distribution, inputs/routing.py)."""
    for i, t in enumerate(texts):
        if column == "distribution":
            try:
                exponent(t)
            except UserError as exc:
                raise UserError(f"{origin}: line {i + 2}, column distribution: {exc}") from None
        elif column in NAMES and t not in NAMES[column]:
            raise UserError(
                f"{origin}: line {i + 2}, column {column}: value {t!r} is not allowed "
                f"(one of {', '.join(NAMES[column])})"
            )


def _check_units_and_sizes(cols: dict, table: str, origin: str) -> None:
    lat = cols["latency_ms"]
    if not len(lat):
        return
    require(
        lat.max() >= 1e-3,
        f"{origin}: every latency is below 1 us (largest {lat.max():.3g}); "
        "latency_ms is in milliseconds, not seconds",
    )
    require(
        lat.min() <= 1e3,
        f"{origin}: even the smallest latency is above 1 s ({lat.min():.3g} ms); "
        "latency_ms is in milliseconds, not microseconds",
    )
    keys = list(TABLE_COLUMNS[table])
    seen: set = set()
    for row, key in enumerate(zip(*(cols[k].tolist() for k in keys))):
        if key in seen:
            raise UserError(
                f"{origin}: line {row + 2}: sizes must not repeat "
                f"({', '.join(f'{k}={v}' for k, v in zip(keys, key))} appears twice)"
            )
        seen.add(key)


def read_table(source: str | Path | IO, table: str, origin: str) -> pd.DataFrame:
    """One checked table as a DataFrame (see `read_columns`)."""
    import pandas as pd

    return pd.DataFrame(read_columns(source, table, origin))


def _as_numbers(texts: list[str]) -> np.ndarray:
    """Text cells to floats; a cell that is not a number becomes NaN (then reported)."""
    try:
        return np.array(texts, dtype=float)
    except ValueError:
        out = np.empty(len(texts))
        for i, t in enumerate(texts):
            try:
                out[i] = float(t)
            except ValueError:
                out[i] = np.nan
        return out


def read_columns(source: str | Path | IO, table: str, origin: str) -> dict[str, np.ndarray]:
    """Read and check one table into numpy columns: required columns, numbers where
    numbers belong, no NaN, latencies > 0, sizes >= 1. Errors name the file, the row
    and the column. Read with the csv module: a prediction needs no pandas."""
    try:
        # counted while it streams in: a gzip that inflates past the bound stops there
        raw = read_bounded(source, origin, MAX_TABLE_BYTES, MAX_TABLE_ROWS).decode()
        rows = list(csv.reader(io.StringIO(raw)))
    except UserError:
        raise
    except Exception as exc:  # a malformed file fails in many ways
        raise UserError(
            f"{origin}: cannot read as CSV ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None
    require(
        len(rows) > 0 and rows[0],
        f"{origin}: cannot read as CSV (EmptyDataError: No columns to parse from file)",
    )
    header, body = [h.strip() for h in rows[0]], [r for r in rows[1:] if r]
    needed = TABLE_COLUMNS[table] + ("latency_ms",)
    missing = [c for c in needed if c not in header]
    require(not missing, f"{origin}: missing column(s) {', '.join(missing)}; needed: {', '.join(needed)}")
    require(len(body) > 0, f"{origin} has no rows; a table needs at least one measured size")
    width = len(header)
    for i, r in enumerate(body):
        if len(r) > width:
            raise UserError(
                f"{origin}: cannot read as CSV (line {i + 2} has {len(r)} fields, the header {width})"
            )
    cells = [[r[j] if j < len(r) else "" for r in body] for j in range(width)]
    cols: dict[str, np.ndarray] = {}
    for name, texts in zip(header, cells):
        if name in TEXT_COLUMNS:
            cols[name] = np.array(texts, dtype=str)
            continue
        nums = _as_numbers(texts)
        if name not in needed and np.isnan(nums).any():
            cols[name] = np.array(texts, dtype=str)  # a column pipesim does not read
            continue
        integral = (
            name != "latency_ms" and len(nums) and np.isfinite(nums).all() and np.all(nums == np.floor(nums))
        )
        cols[name] = nums.astype(np.int64) if integral else nums
        if name not in needed:
            continue
        bad = ~np.isfinite(nums)
        if not bad.any():
            # sizes are whole numbers (a count of GPUs, bytes, tokens, heads)
            bad = nums <= 0 if name == "latency_ms" else (nums < 1) | (nums != np.floor(nums))
        if bad.any():
            row = int(bad.nonzero()[0][0])
            raise UserError(
                f"{origin}: line {row + 2}, column {name}: value {texts[row]!r} is not allowed "
                f"({'a finite latency > 0 in ms' if name == 'latency_ms' else 'a whole size >= 1'})"
            )
    for name in needed:
        if name in TEXT_COLUMNS:
            texts = cells[header.index(name)]
            empty = [i for i, t in enumerate(texts) if not t]
            if empty:
                raise UserError(
                    f"{origin}: line {empty[0] + 2}, column {name}: value nan is not allowed (a text value)"
                )
            _check_names(texts, name, origin)
    _check_units_and_sizes(cols, table, origin)
    return cols

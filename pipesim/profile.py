"""Calibration profiles: what was measured on a box, with where each number came from.

A profile is a directory:

    profile.toml        name, box preset, engine and version, date, the source of every
                        table, parameters the tables do not pin, and the launch flags of
                        the measured deployment (if any)
    <table>.csv.gz      measured latency tables (milliseconds), see TABLE_COLUMNS

Shipped profiles live in the package `pipesim.profiles` (the repository's
calibration/profiles); any other directory can be given by path.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .calibrate.measured import read_points
from .checks import is_number, parse_toml, read_text
from .errors import UserError, require
from .interp import Surface, group_curves

if TYPE_CHECKING:  # tables are read into numpy columns; pandas only where a DataFrame is asked for
    import pandas as pd

# Key columns of each table (latency_ms is the value). Sizes are per GPU.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "gemm": ("dtype", "m", "n", "k"),
    "moe": ("dtype", "hidden", "inter", "topk", "experts", "moe_tp", "distribution", "tokens"),
    "mla_decode": ("heads_per_gpu", "batch", "context"),
    "mla_prefill": ("heads_per_gpu", "batch", "isl"),
    "gqa_decode": ("heads_per_gpu", "kv_heads_per_gpu", "head_dim", "batch", "context"),
    "gqa_prefill": ("heads_per_gpu", "kv_heads_per_gpu", "head_dim", "batch", "isl"),
    "collectives": ("op", "impl", "gpus", "nbytes"),
}
TEXT_COLUMNS = {"dtype", "distribution", "op", "impl"}
CACHE_VERSION = 1  # of the parsed-table cache's layout (`_cached_columns`)
CACHE_MIN_BYTES = 64 * 1024  # smaller table files parse in milliseconds: not worth a cached copy
# profile.toml: keys that must be tables, and keys that must be strings
META_TABLES = ("params", "deployment", "sources", "param_sources")
META_STRINGS = ("name", "box", "engine", "engine_version", "description", "model")


def sig6(x: float) -> float:
    """x to 6 significant digits, the precision measured latencies are stored at
    (plenty for timings, and it keeps the tables small)."""
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class Params:
    """Costs the tables do not pin. Each is measured, fitted (with its fit report in the
    profile) or left at a stated neutral value; `profile.toml` says which."""

    cpu_iteration_ms: float = 0.0  # scheduler CPU time per micro-batch iteration (stage 0)
    cpu_hop_ms: float = 0.0  # CPU time per PP hop per micro-batch (metadata pickling)
    allreduce_scale: float = 1.0  # this box's TP path vs its measured all-reduce table
    allreduce_offset_us: float = 0.0  # extra fixed cost per all-reduce on this box's TP path
    kernel_floor_us: float = 0.0  # shortest kernel on this GPU (launch + tail)
    eager_launch_us_per_layer: float = 0.0  # CPU time to launch one layer's kernels without CUDA graphs
    kernel_scale: float = 1.0  # this deployment's kernels vs the measured kernel tables
    frontend_ms: float = 0.0  # per request, serial: tokenize + hand to the scheduler
    detokenize_step_us: float = 0.0  # output path per returned step (detokenizer, serial)
    detokenize_token_us: float = 0.0  # output path per token of a returned step
    moe_distribution: str = "power_law_1.01"  # routing skew to read the MoE table at
    custom_allreduce_max_gpus: int = 2  # engines use their custom all-reduce up to this many PCIe GPUs

    @classmethod
    def from_dict(cls, data: dict, origin: str) -> Params:
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        require(
            not unknown, f"{origin}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
        values = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            v = data[f.name]
            if f.name == "moe_distribution":
                values[f.name] = str(v)
                continue
            require(
                is_number(v) and math.isfinite(v) and v >= 0,
                f"{origin}: parameter {f.name} = {v!r} must be a finite number >= 0",
            )
            values[f.name] = int(v) if f.name == "custom_allreduce_max_gpus" else float(v)
        return cls(**values)


class Tables(Mapping):
    """A profile's tables (name -> DataFrame) and the lookups built from them once.

    Loaded tables are kept as numpy columns (`columns`): the lookups read those, and a
    DataFrame is built only when a table is asked for by name (calibration, reports),
    so a prediction never imports pandas. Kept apart from `Profile` so that a profile
    with other parameters (a what-if, a fit candidate) shares the same indexed tables."""

    def __init__(
        self, frames: Mapping | None = None, *, columns: dict[str, dict[str, np.ndarray]] | None = None
    ):
        self._frames = dict(frames or {})
        self._columns = dict(columns or {})

    def __getitem__(self, table: str) -> pd.DataFrame:
        if table not in self._frames:
            if table not in self._columns:
                raise KeyError(table)
            import pandas as pd

            self._frames[table] = pd.DataFrame(self._columns[table])
        return self._frames[table]

    def __iter__(self):
        return iter(sorted(set(self._frames) | set(self._columns), key=list(TABLE_COLUMNS).index))

    def __len__(self) -> int:
        return len(set(self._frames) | set(self._columns))

    def __contains__(self, table: object) -> bool:
        return table in self._frames or table in self._columns

    def columns(self, table: str) -> dict[str, np.ndarray] | None:
        """The table's columns as numpy arrays (None: the profile has no such table)."""
        if table in self._columns:
            return self._columns[table]
        df = self._frames.get(table)
        return None if df is None else {c: df[c].to_numpy() for c in df.columns}

    @cached_property
    def gemm(self) -> dict:
        """dtype -> (ns, ks, {(n, k): Curve over m})."""
        out = {}
        df = self.columns("gemm")
        if df is None:
            return out
        for dtype, part in _groups(df, ("dtype",)):
            curves = group_curves(_keys(part, ("n", "k")), part["m"], part["latency_ms"])
            ns = sorted({n for n, _ in curves})
            ks = sorted({k for _, k in curves})
            out[str(dtype)] = (ns, ks, curves)
        return out

    @cached_property
    def moe(self) -> dict:
        """(dtype, hidden, inter, topk, experts, moe_tp, distribution) -> Curve over tokens."""
        df = self.columns("moe")
        if df is None:
            return {}
        out = {}
        for (dtype, dist), part in _groups(df, ("dtype", "distribution")):
            shape = _keys(part, ("hidden", "inter", "topk", "experts", "moe_tp"))
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
        return self._surfaces("mla_decode", "batch", "context")

    @cached_property
    def mla_prefill(self) -> dict:
        """(heads_per_gpu,) -> Surface over (batch, isl)."""
        return self._surfaces("mla_prefill", "batch", "isl")

    @cached_property
    def gqa_decode(self) -> dict:
        return self._surfaces("gqa_decode", "batch", "context")

    @cached_property
    def gqa_prefill(self) -> dict:
        return self._surfaces("gqa_prefill", "batch", "isl")

    @cached_property
    def collectives(self) -> dict:
        """(op, impl, gpus) -> Curve over nbytes."""
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


def _keys(cols: dict, names) -> np.ndarray:
    return np.column_stack([np.asarray(cols[c]).astype(np.int64) for c in names])


def _groups(cols: dict, by: tuple[str, ...]):
    """(key, columns of its rows in table order) per distinct value of the `by`
    columns, keys sorted (as a DataFrame groupby)."""
    keys = list(zip(*(np.asarray(cols[c]).astype(str).tolist() for c in by)))
    for key in sorted(set(keys)):
        mask = np.fromiter((k == key for k in keys), dtype=bool, count=len(keys))
        yield (key[0] if len(by) == 1 else key), {c: np.asarray(v)[mask] for c, v in cols.items()}


@dataclass(frozen=True)
class Profile:
    name: str
    box: str
    engine: str
    engine_version: str
    params: Params
    meta: dict = field(hash=False, compare=False)
    tables: Tables = field(hash=False, compare=False)
    measured: tuple = field(default=(), hash=False, compare=False)  # measured.Point, to fit and validate
    foreign: str = field(
        default="", hash=False, compare=False
    )  # what differs from the run it costs (borrowed)
    box_spec: object = field(
        default=None, hash=False, compare=False
    )  # the Box it was built for (catalogue), else box names it

    @property
    def sources(self) -> dict:
        return self.meta.get("sources", {})

    @property
    def deployment(self) -> dict:
        """Engine flags of the measured deployment, used as defaults for this profile."""
        return self.meta.get("deployment", {})

    def with_params(self, **values) -> Profile:
        """The same profile (same indexed tables) with some parameters changed."""
        return replace(self, params=replace(self.params, **values))

    # lookups, from the shared tables
    gemm = property(lambda self: self.tables.gemm)
    moe = property(lambda self: self.tables.moe)
    mla_decode = property(lambda self: self.tables.mla_decode)
    mla_prefill = property(lambda self: self.tables.mla_prefill)
    gqa_decode = property(lambda self: self.tables.gqa_decode)
    gqa_prefill = property(lambda self: self.tables.gqa_prefill)
    collectives = property(lambda self: self.tables.collectives)


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


# ---- loading and writing -----------------------------------------------------------------


def _shipped():
    """Where the shipped profiles are: the installed package `pipesim.profiles`, or
    calibration/profiles beside the source when pipesim runs uninstalled."""
    try:
        return resources.files("pipesim.profiles")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "calibration" / "profiles"


def profile_names() -> list[str]:
    root = _shipped()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.joinpath("profile.toml").is_file())


def _profile_dir(name_or_path: str | Path):
    text = str(name_or_path)
    if text in profile_names():
        return _shipped().joinpath(text)
    path = Path(text)
    recover_profile(path)
    require(
        path.is_dir() and (path / "profile.toml").is_file(),
        f"unknown profile '{text}'; known: {', '.join(profile_names()) or 'none'}, "
        "or a directory holding profile.toml",
    )
    return path


def profile_folder(name_or_path: str | Path) -> Path:
    """Where a profile's files live on disk: a shipped profile's folder inside the
    installed package, or the directory given."""
    return Path(str(_profile_dir(name_or_path))).resolve()


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile (cached per process while its files are unchanged: a sweep loads
    and indexes the tables once)."""
    folder = _profile_dir(name_or_path)
    stamp = (
        tuple(
            (p.name, p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(Path(str(folder)).iterdir())
            if p.is_file()
        )
        if Path(str(folder)).is_dir()
        else ()
    )
    return _load_profile(str(folder), stamp)


def _cache_dir() -> Path:
    return Path(os.environ.get("PIPESIM_CACHE_DIR") or Path.home() / ".cache" / "pipesim")


def _cached_columns(f, table: str) -> dict[str, np.ndarray]:
    """A table's checked columns, kept as .npz under the cache folder (PIPESIM_CACHE_DIR,
    default ~/.cache/pipesim) keyed by the file's path, size and modification time:
    parsing the largest tables costs more than the rest of a prediction, a cached read
    a few milliseconds. The cache is only ever a copy; a folder that cannot be written
    is skipped, and files under CACHE_MIN_BYTES are parsed each time."""
    try:
        st = Path(str(f)).stat()
        if st.st_size < CACHE_MIN_BYTES:
            raise OSError("small table: parsed each time")
        key = hashlib.sha256(
            f"{Path(str(f)).resolve()}|{st.st_size}|{st.st_mtime_ns}|{CACHE_VERSION}".encode()
        ).hexdigest()[:24]
        cached = _cache_dir() / f"{table}-{key}.npz"
    except OSError:
        cached = None
    if cached is not None and cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as z:
                return {name: z[name] for name in z.files}
        except Exception:
            pass
    with f.open("rb") as fh:
        cols = read_columns(fh, table, str(f))
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp.npz")
            np.savez(tmp, **cols)
            os.replace(tmp, cached)
        except OSError:
            pass
    return cols


@lru_cache(maxsize=8)
def _load_profile(folder_text: str, _stamp: tuple) -> Profile:
    folder = Path(folder_text)
    meta_file = folder.joinpath("profile.toml")
    meta = parse_toml(read_text(meta_file, "profile file"), str(meta_file))
    for key in ("name", "box", "engine"):
        require(key in meta, f"{meta_file}: missing '{key}'")
    for key, v in meta.items():
        if key in META_TABLES:
            require(isinstance(v, dict), f"{meta_file}: '{key}' must be a table, got {type(v).__name__}")
        elif key in META_STRINGS:
            require(isinstance(v, str), f"{meta_file}: '{key}' must be a string, got {v!r}")
    for key in ("sources", "param_sources"):
        bad = [k for k, v in meta.get(key, {}).items() if not isinstance(v, str)]
        require(not bad, f"{meta_file}: {key}.{bad[0] if bad else ''} must be a string")
    params = Params.from_dict(meta.get("params", {}), str(meta_file))
    box = str(meta["box"])
    if box.endswith(".toml") and folder.joinpath(box).is_file():
        box = str(folder.joinpath(box))  # a box file written beside the profile (calibrate live)
    columns = {}
    for table in TABLE_COLUMNS:
        f = folder.joinpath(f"{table}.csv.gz")
        if f.is_file():
            columns[table] = _cached_columns(f, table)
    tables = Tables(columns=columns)
    measured: tuple = ()
    f = folder.joinpath("measured.csv")
    if f.is_file():
        with f.open("r") as fh:
            measured = tuple(
                read_points(fh, str(f), str(meta.get("model", "kimi-k2.6")), str(meta["engine"]))
            )
    return Profile(
        str(meta["name"]),
        box,
        str(meta["engine"]),
        str(meta.get("engine_version", "")),
        params,
        meta,
        tables,
        measured,
    )


def read_table(source, table: str, origin: str) -> pd.DataFrame:
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


def read_columns(source, table: str, origin: str) -> dict[str, np.ndarray]:
    """Read and check one table into numpy columns: required columns, numbers where
    numbers belong, no NaN, latencies > 0, sizes >= 1. Errors name the file, the row
    and the column. Read with the csv module: a prediction needs no pandas."""
    try:
        raw = source.read() if hasattr(source, "read") else Path(source).read_bytes()
        if isinstance(raw, bytes):
            raw = (gzip.decompress(raw) if origin.endswith(".gz") else raw).decode()
        rows = list(csv.reader(io.StringIO(raw)))
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
            empty = [i for i, t in enumerate(cells[header.index(name)]) if not t]
            if empty:
                raise UserError(
                    f"{origin}: line {empty[0] + 2}, column {name}: value nan is not allowed (a text value)"
                )
    _check_units_and_sizes(cols, table, origin)
    return cols


def write_profile(
    out_dir: str | Path,
    meta: dict,
    tables: dict[str, pd.DataFrame],
    measured: pd.DataFrame | None = None,
    extra: dict[str, str] | None = None,
) -> Path:
    """Write a profile directory so that a reader sees the old one or the whole new one.

    Everything goes to a sibling `.NAME.new-*` directory; once complete, the old
    profile is renamed to `.NAME.old` and the new one into place, then the old one is
    removed. A kill between the two renames leaves `.NAME.old` and no NAME:
    `recover_profile` (run by every load and write) renames it back. `measured`
    becomes measured.csv; `extra` maps file names (a fit report, a log) to their text.
    One writer at a time."""
    import shutil
    import tempfile

    from ._toml import dumps
    from .files import check_profile_out

    out = check_profile_out(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    recover_profile(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    tmp.chmod(0o755)
    old = out.with_name(f".{out.name}.old")
    try:
        for name, df in tables.items():
            require(name in TABLE_COLUMNS, f"unknown table {name}")
            # mtime=0 keeps rebuilt files byte-identical when their content is
            df.to_csv(tmp / f"{name}.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})
        if measured is not None and len(measured):
            measured.to_csv(tmp / "measured.csv", index=False)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        (tmp / "profile.toml").write_text(dumps(meta))
        if out.exists():
            os.rename(out, old)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        recover_profile(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out


def recover_profile(out: str | Path) -> None:
    """Finish or undo a profile write that was killed: put `.NAME.old` back when NAME is
    missing, and remove what a write leaves beside NAME (`.NAME.old`, `.NAME.new-*`)."""
    import shutil

    out = Path(out)
    if not out.parent.is_dir():
        return
    old = out.with_name(f".{out.name}.old")
    if old.is_dir() and not out.exists():
        os.rename(old, out)
    for leftover in out.parent.glob(f".{out.name}.new-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


KEPT_AS_IS = ("profile.toml", "measured.csv")  # rewritten from their parsed form


def profile_files(name_or_path: str | Path) -> dict[str, str]:
    """The text files of a profile besides its tables, profile.toml and measured.csv
    (reports, logs, a box.toml, live extras), to carry them over when it is rewritten."""
    folder = _profile_dir(name_or_path)
    return {
        p.name: p.read_text()
        for p in folder.iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and not p.name.endswith(".csv.gz")
        and p.name not in KEPT_AS_IS
    }


def rewrite_profile(
    name_or_path: str | Path,
    out: str | Path | None = None,
    *,
    tables: dict | None = None,
    measured: pd.DataFrame | None = None,
    meta_update: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Write a profile again, atomically, with some parts replaced (in place unless `out`)."""
    import pandas as pd

    from .calibrate.measured import points_frame

    prof = load_profile(name_or_path)
    if measured is None:
        measured = points_frame(list(prof.measured)) if prof.measured else pd.DataFrame()
    return write_profile(
        out or name_or_path,
        {**prof.meta, **(meta_update or {})},
        {**prof.tables, **(tables or {})},
        measured,
        {**profile_files(name_or_path), **(extra or {})},
    )

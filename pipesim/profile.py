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

from dataclasses import dataclass, field, fields, replace
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from ._toml import toml_reader
from .errors import UserError, require
from .interp import Surface, group_curves
from .calibrate.measured import read_points

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


def sig6(x: float) -> float:
    """x to 6 significant digits, the precision measured latencies are stored at
    (plenty for timings, and it keeps the tables small)."""
    return float(f"{x:.6g}")


@dataclass(frozen=True)
class Params:
    """Costs the tables do not pin. Each is measured, fitted (with its fit report in the
    profile) or left at a stated neutral value; `profile.toml` says which."""

    cpu_iteration_ms: float = 0.0     # scheduler CPU time per micro-batch iteration (stage 0)
    cpu_hop_ms: float = 0.0           # CPU time per PP hop per micro-batch (metadata pickling)
    allreduce_scale: float = 1.0      # this box's TP path vs its measured all-reduce table
    allreduce_offset_us: float = 0.0  # extra fixed cost per all-reduce on this box's TP path
    kernel_floor_us: float = 0.0      # shortest kernel on this GPU (launch + tail)
    eager_launch_us_per_layer: float = 0.0  # CPU time to launch one layer's kernels without CUDA graphs
    kernel_scale: float = 1.0         # this deployment's kernels vs the measured kernel tables
    frontend_ms: float = 0.0          # per request, serial: tokenize + hand to the scheduler
    detokenize_step_us: float = 0.0   # output path per returned step (detokenizer, serial)
    detokenize_token_us: float = 0.0  # output path per token of a returned step
    moe_distribution: str = "power_law_1.01"  # routing skew to read the MoE table at
    custom_allreduce_max_gpus: int = 2  # engines use their custom all-reduce up to this many PCIe GPUs

    @classmethod
    def from_dict(cls, data: dict, origin: str) -> "Params":
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        require(not unknown, f"{origin}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(known)}")
        values = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            v = data[f.name]
            if f.name == "moe_distribution":
                values[f.name] = str(v)
                continue
            require(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 and v == v,
                    f"{origin}: parameter {f.name} = {v!r} must be a number >= 0")
            values[f.name] = int(v) if f.name == "custom_allreduce_max_gpus" else float(v)
        return cls(**values)


class Tables(dict):
    """A profile's tables (name -> DataFrame) and the lookups built from them once.

    Kept apart from `Profile` so that a profile with other parameters (a what-if, a
    fit candidate) shares the same indexed tables."""

    @cached_property
    def gemm(self) -> dict:
        """dtype -> (ns, ks, {(n, k): Curve over m})."""
        out = {}
        df = self.get("gemm")
        if df is None:
            return out
        for dtype, part in df.groupby("dtype"):
            curves = group_curves(part[["n", "k"]].to_numpy(dtype=np.int64), part["m"], part["latency_ms"])
            ns = sorted({n for n, _ in curves})
            ks = sorted({k for _, k in curves})
            out[str(dtype)] = (ns, ks, curves)
        return out

    @cached_property
    def moe(self) -> dict:
        """(dtype, hidden, inter, topk, experts, moe_tp, distribution) -> Curve over tokens."""
        df = self.get("moe")
        if df is None:
            return {}
        out = {}
        for (dtype, dist), part in df.groupby(["dtype", "distribution"]):
            shape = part[["hidden", "inter", "topk", "experts", "moe_tp"]].to_numpy(dtype=np.int64)
            for key, curve in group_curves(shape, part["tokens"], part["latency_ms"]).items():
                out[(str(dtype),) + key + (str(dist),)] = curve
        return out

    def _surfaces(self, table: str, outer: str, inner: str) -> dict:
        df = self.get(table)
        if df is None:
            return {}
        keys = [c for c in TABLE_COLUMNS[table] if c not in (outer, inner)]
        curves = group_curves(df[keys + [outer]].to_numpy(dtype=np.int64), df[inner], df["latency_ms"])
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
        df = self.get("collectives")
        if df is None:
            return {}
        out = {}
        for (op, impl), part in df.groupby(["op", "impl"]):
            for (n,), curve in group_curves(part[["gpus"]].to_numpy(dtype=np.int64), part["nbytes"], part["latency_ms"]).items():
                out[(str(op), str(impl), int(n))] = curve
        return out


@dataclass(frozen=True)
class Profile:
    name: str
    box: str
    engine: str
    engine_version: str
    params: Params
    meta: dict = field(hash=False, compare=False)
    tables: Tables = field(hash=False, compare=False)
    measured: tuple = field(default=(), hash=False, compare=False)   # measured.Point, to fit and validate

    @property
    def sources(self) -> dict:
        return self.meta.get("sources", {})

    @property
    def deployment(self) -> dict:
        """Engine flags of the measured deployment, used as defaults for this profile."""
        return self.meta.get("deployment", {})

    def with_params(self, **values) -> "Profile":
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


def _check_units_and_sizes(df: pd.DataFrame, table: str, origin: str) -> None:
    lat = df["latency_ms"]
    require(lat.max() >= 1e-3, f"{origin}: every latency is below 1 us (largest {lat.max():.3g}); "
            "latency_ms is in milliseconds, not seconds")
    require(lat.min() <= 1e3, f"{origin}: even the smallest latency is above 1 s ({lat.min():.3g} ms); "
            "latency_ms is in milliseconds, not microseconds")
    keys = list(TABLE_COLUMNS[table])
    dup = df.duplicated(keys, keep="first")
    if dup.any():
        row = int(dup.to_numpy().nonzero()[0][0])
        raise UserError(f"{origin}: line {row + 2}: sizes must not repeat ({', '.join(f'{k}={df[k].iloc[row]}' for k in keys)} "
                        "appears twice)")


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
    require(path.is_dir() and (path / "profile.toml").is_file(),
            f"unknown profile '{text}'; known: {', '.join(profile_names()) or 'none'}, "
            "or a directory holding profile.toml")
    return path


def profile_folder(name_or_path: str | Path) -> Path:
    """Where a profile's files live on disk: a shipped profile's folder inside the
    installed package, or the directory given."""
    return Path(str(_profile_dir(name_or_path))).resolve()


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile (cached per process while its files are unchanged: a sweep loads
    and indexes the tables once)."""
    folder = _profile_dir(name_or_path)
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(Path(str(folder)).iterdir())
                  if p.is_file()) if Path(str(folder)).is_dir() else ()
    return _load_profile(str(folder), stamp)


@lru_cache(maxsize=8)
def _load_profile(folder_text: str, _stamp: tuple) -> Profile:
    folder = Path(folder_text)
    meta_file = folder.joinpath("profile.toml")
    try:
        meta = toml_reader.loads(meta_file.read_text())
    except toml_reader.TOMLDecodeError as exc:
        raise UserError(f"{meta_file}: not valid TOML: {exc}") from None
    for key in ("name", "box", "engine"):
        require(key in meta, f"{meta_file}: missing '{key}'")
    params = Params.from_dict(meta.get("params", {}), str(meta_file))
    box = str(meta["box"])
    if box.endswith(".toml") and folder.joinpath(box).is_file():
        box = str(folder.joinpath(box))  # a box file written beside the profile (calibrate live)
    tables = Tables()
    for table in TABLE_COLUMNS:
        f = folder.joinpath(f"{table}.csv.gz")
        if f.is_file():
            with f.open("rb") as fh:
                tables[table] = read_table(fh, table, str(f))
    measured: tuple = ()
    f = folder.joinpath("measured.csv")
    if f.is_file():
        with f.open("r") as fh:
            measured = tuple(read_points(fh, str(f), str(meta.get("model", "kimi-k2.6")), str(meta["engine"])))
    return Profile(str(meta["name"]), box, str(meta["engine"]), str(meta.get("engine_version", "")),
                   params, meta, tables, measured)


def read_table(source, table: str, origin: str) -> pd.DataFrame:
    """Read and check one table: required columns, numbers where numbers belong, no NaN,
    latencies > 0, sizes >= 1. Errors name the file, the row and the column."""
    try:
        df = pd.read_csv(source, compression="gzip" if origin.endswith(".gz") else None)
    except Exception as exc:  # pandas raises many types for a malformed file
        raise UserError(f"{origin}: cannot read as CSV ({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    needed = TABLE_COLUMNS[table] + ("latency_ms",)
    missing = [c for c in needed if c not in df.columns]
    require(not missing, f"{origin}: missing column(s) {', '.join(missing)}; needed: {', '.join(needed)}")
    for col in needed:
        if col in TEXT_COLUMNS:
            bad = df[col].isna()
        else:
            df[col] = pd.to_numeric(df[col], errors="coerce")
            bad = df[col].isna()
            if not bad.any():
                bad = df[col] <= 0 if col == "latency_ms" else df[col] < 1
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(f"{origin}: line {row + 2}, column {col}: value {df[col].iloc[row]!r} is not allowed "
                            f"({'a latency > 0 in ms' if col == 'latency_ms' else 'a text value' if col in TEXT_COLUMNS else 'a size >= 1'})")
    _check_units_and_sizes(df, table, origin)
    return df


def write_profile(out_dir: str | Path, meta: dict, tables: dict[str, pd.DataFrame],
                  measured: pd.DataFrame | None = None, extra: dict[str, str] | None = None) -> Path:
    """Write a profile directory atomically: everything goes to a sibling temporary
    directory that replaces `out_dir` only once complete. `measured` becomes
    measured.csv; `extra` maps file names (a fit report, a log) to their text."""
    import shutil
    import tempfile

    from ._toml import dumps

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)
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
        old = out.with_name(f".{out.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


KEPT_AS_IS = ("profile.toml", "measured.csv")   # rewritten from their parsed form


def profile_files(name_or_path: str | Path) -> dict[str, str]:
    """The text files of a profile besides its tables, profile.toml and measured.csv
    (reports, logs, a box.toml, live extras), to carry them over when it is rewritten."""
    folder = _profile_dir(name_or_path)
    return {p.name: p.read_text() for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".csv.gz")
            and p.name not in KEPT_AS_IS}


def rewrite_profile(name_or_path: str | Path, out: str | Path | None = None, *, tables: dict | None = None,
                    measured: pd.DataFrame | None = None, meta_update: dict | None = None,
                    extra: dict | None = None) -> Path:
    """Write a profile again, atomically, with some parts replaced (in place unless `out`)."""
    from .calibrate.measured import points_frame

    prof = load_profile(name_or_path)
    if measured is None:
        measured = points_frame(list(prof.measured)) if prof.measured else pd.DataFrame()
    return write_profile(out or name_or_path, {**prof.meta, **(meta_update or {})}, {**prof.tables, **(tables or {})},
                         measured, {**profile_files(name_or_path), **(extra or {})})

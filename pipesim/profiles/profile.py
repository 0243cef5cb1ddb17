"""Calibration profiles: what was measured on a box, with where each number came from.

A profile is a directory:

    profile.toml        name, box preset, engine and version, date, the source of every
                        table, parameters the tables do not pin, and the launch flags of
                        the measured deployment (if any)
    <table>.csv.gz      measured latency tables (milliseconds), see TABLE_COLUMNS

Shipped profiles live in the package `pipesim.data.profiles` (the repository's
calibration/profiles); any other directory can be given by path.
"""

from __future__ import annotations

import math
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache, partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.checks import MAX_GPUS, is_number, parse_toml, read_text, whole
from ..base.errors import require
from ..base.writes import lock, old_versions
from ..inputs.routing import exponent
from .bounds import check_tables, datasheet
from .measured import Point, read_points
from .table_cache import cached_columns, table_key
from .tables import TABLE_COLUMNS, Tables

if TYPE_CHECKING:
    from importlib.abc import Traversable

    from ..inputs.box import Box

DEFAULT_PROFILE = "rtx-pro-6000-sglang-deployment"  # the reference deployment
# profile.toml: keys that must be tables, and keys that must be strings
META_TABLES = ("params", "deployment", "sources", "param_sources")
META_STRINGS = ("name", "box", "engine", "engine_version", "description", "model")


@dataclass(frozen=True)
class Params:
    """Costs the tables do not pin. Each is measured, fitted (with its fit report in the
    profile) or left at a stated neutral value; `profile.toml` says which."""

    cpu_iteration_ms: float = 0.0  # extra scheduler CPU per loop iteration, empty ones included (absolute)
    cpu_hop_ms: float = 0.0  # CPU time per PP hop per micro-batch (metadata pickling)
    allreduce_scale: float = 1.0  # this box's TP path vs its measured all-reduce table
    allreduce_offset_us: float = 0.0  # extra fixed cost per all-reduce on this box's TP path
    kernel_floor_us: float = 0.0  # shortest kernel on this GPU (launch + tail)
    # CPU time to launch one layer's kernels without CUDA graphs, as measured or fitted on a
    # deployment (absolute); 0: kernels per layer (costs/host.py) x launch_us_per_kernel
    eager_launch_us_per_layer: float = 0.0
    kernel_scale: float = 1.0  # this deployment's kernels vs the measured kernel tables
    frontend_ms: float = 0.0  # per request, serial: tokenize + hand to the scheduler
    detokenize_step_us: float = 0.0  # output path per returned step (detokenizer, serial)
    detokenize_token_us: float = 0.0  # output path per token of a returned step
    moe_distribution: str = "power_law_1.01"  # routing skew to read the MoE table at
    custom_allreduce_max_gpus: int = 2  # engines use their custom all-reduce up to this many PCIe GPUs
    # The engine's host loop (costs/host.py, docs/host-loop.md §6; defaults per engine and
    # version: pipesim/data/host_loop.toml). CPU time on the CPU the engines' code was timed
    # on, multiplied by host_cpu_factor; so are frontend_ms, detokenize_* and cpu_hop_ms
    # (measured on the same kind of CPU). cpu_iteration_ms and eager_launch_us_per_layer
    # are a deployment's own, taken as they are.
    host_cpu_factor: float = 1.0  # the deployment's CPU against the measuring CPU (cpu_speed.py)
    sched_base_us: float = 0.0  # scheduler per step: fixed part
    sched_per_req_us: float = 0.0  # ... per request in the step
    sched_per_prefill_token_us: float = 0.0  # ... per prompt token in the step
    prep_base_us: float = 0.0  # input preparation and sampling's host part per step: fixed part
    prep_per_req_us: float = 0.0  # ... per request in the step
    out_step_base_us: float = 0.0  # vLLM V0: the engine loop's output processing per step
    out_step_per_req_us: float = 0.0  # ... per request in the step
    launch_us_per_kernel: float = 0.0  # CPU time to launch one kernel from a model layer, eager
    piecewise_kernels_decode: float = 0.0  # kernels per layer a graphed decode batch still launches
    piecewise_kernels_mixed: float = 0.0  # ... a graphed batch with prompt tokens
    tp_bcast_base_us: float = 0.0  # the step's objects to the other TP ranks over the CPU group
    tp_bcast_per_rank_us: float = 0.0  # ... per rank beyond the first
    stream_step_us: float = 0.0  # output path per returned step (the API process, serial)
    stream_token_us: float = 0.0  # ... per streamed token

    @classmethod
    def from_dict(cls, data: dict, origin: str) -> Params:
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        require(
            not unknown, f"{origin}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
        values: dict[str, Any] = {}  # each value checked below against its field
        for f in fields(cls):
            if f.name not in data:
                continue
            v = data[f.name]
            if f.name == "moe_distribution":  # an enumerated value: parsed, never read as another
                exponent(v, f"{origin}: parameter moe_distribution")
                values[f.name] = str(v)
                continue
            above = f.name in POSITIVE
            require(
                is_number(v) and math.isfinite(v) and (v > 0 if above else v >= 0),
                f"{origin}: parameter {f.name} = {v!r} must be a finite number {'>' if above else '>='} 0"
                + (" (a scale: 0 would make every such cost free)" if above else ""),
            )
            if f.name == "custom_allreduce_max_gpus":
                values[f.name] = whole(v, f"{origin}: parameter {f.name}", 0, MAX_GPUS)
                continue
            values[f.name] = float(v)
        return cls(**values)


# parameters that scale a cost: 0 would make it free (the what-if flags refuse it too, whatif.py)
POSITIVE = ("kernel_scale", "allreduce_scale")


# The Params a fit may move (calibrate/fit.py) and the tornado may step (report/sensitivity.py):
# name -> (lower bound, upper bound, unit of the optimizer's variable)
FITTABLE = {
    "cpu_iteration_ms": (0.0, 200.0, 1.0),
    "cpu_hop_ms": (0.0, 50.0, 0.1),
    "allreduce_scale": (0.05, 200.0, 1.0),
    "allreduce_offset_us": (0.0, 10000.0, 100.0),
    "eager_launch_us_per_layer": (0.0, 20000.0, 100.0),
    "kernel_scale": (0.2, 10.0, 1.0),
    "frontend_ms": (0.0, 50.0, 0.1),
    "detokenize_step_us": (0.0, 50000.0, 100.0),
    "detokenize_token_us": (0.0, 5000.0, 10.0),
    "host_cpu_factor": (0.1, 20.0, 0.5),
    "sched_base_us": (0.0, 20000.0, 10.0),
    "sched_per_req_us": (0.0, 1000.0, 1.0),
    "sched_per_prefill_token_us": (0.0, 100.0, 0.1),
    "prep_base_us": (0.0, 20000.0, 10.0),
    "prep_per_req_us": (0.0, 1000.0, 1.0),
    "out_step_base_us": (0.0, 20000.0, 10.0),
    "out_step_per_req_us": (0.0, 1000.0, 1.0),
    "launch_us_per_kernel": (0.0, 500.0, 5.0),
    "tp_bcast_base_us": (0.0, 20000.0, 10.0),
    "tp_bcast_per_rank_us": (0.0, 5000.0, 10.0),
    "stream_step_us": (0.0, 50000.0, 10.0),
    "stream_token_us": (0.0, 5000.0, 1.0),
}
# The host-loop terms (docs/host-loop.md §6): the defaults of pipesim/data/host_loop.toml set
# them, and cpu_hop_ms, frontend_ms and detokenize_* among them, per engine and version
HOST_PARAMS = (
    "host_cpu_factor",
    "sched_base_us",
    "sched_per_req_us",
    "sched_per_prefill_token_us",
    "prep_base_us",
    "prep_per_req_us",
    "out_step_base_us",
    "out_step_per_req_us",
    "launch_us_per_kernel",
    "piecewise_kernels_decode",
    "piecewise_kernels_mixed",
    "tp_bcast_base_us",
    "tp_bcast_per_rank_us",
    "stream_step_us",
    "stream_token_us",
    "detokenize_step_us",
    "detokenize_token_us",
    "frontend_ms",
    "cpu_hop_ms",
    "cpu_iteration_ms",
)


@dataclass(frozen=True)
class Profile:
    name: str
    box: str
    engine: str
    engine_version: str
    params: Params
    meta: dict = field(hash=False, compare=False)
    tables: Tables = field(hash=False, compare=False)
    measured: tuple[Point, ...] = field(default=(), hash=False, compare=False)  # to fit and validate
    foreign: str = field(
        default="", hash=False, compare=False
    )  # what differs from the run it costs (borrowed)
    box_spec: Box | None = field(
        default=None, hash=False, compare=False
    )  # the Box it was built for (catalogue), else box names it

    @property
    def sources(self) -> dict:
        return self.meta.get("sources", {})

    @property
    def deployment(self) -> dict:
        """Engine flags of the measured deployment, used as defaults for this profile."""
        return self.meta.get("deployment", {})

    def with_params(self, **values: float | str) -> Profile:
        """The same profile (same indexed tables) with some parameters changed; they are
        then its own (`meta["params"]`), so the host loop's defaults do not replace them
        (profiles/hostloop.py)."""
        meta = {**self.meta, "params": {**self.meta.get("params", {}), **values}}
        # replace() refuses a name that is not a field; that each value suits its field
        # (a float, moe_distribution a str) is the caller's: keywords of one type cannot
        # be matched field by field
        params = replace(self.params, **values)  # type: ignore[arg-type]
        return replace(self, params=params, meta=meta)

    # lookups, from the shared tables
    gemm = property(lambda self: self.tables.gemm)
    moe = property(lambda self: self.tables.moe)
    moe_ep = property(lambda self: self.tables.moe_ep)
    mla_decode = property(lambda self: self.tables.mla_decode)
    mla_prefill = property(lambda self: self.tables.mla_prefill)
    gqa_decode = property(lambda self: self.tables.gqa_decode)
    gqa_prefill = property(lambda self: self.tables.gqa_prefill)
    collectives = property(lambda self: self.tables.collectives)


# ---- loading and writing -----------------------------------------------------------------


def _shipped() -> Traversable:
    """Where the shipped profiles are: the installed package `pipesim.data.profiles`, or
    calibration/profiles beside the source when pipesim runs uninstalled."""
    try:
        return resources.files("pipesim.data.profiles")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "calibration" / "profiles"


def profile_names() -> list[str]:
    root = _shipped()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.joinpath("profile.toml").is_file())


def _profile_dir(name_or_path: str | Path) -> Traversable:
    """A shipped profile's folder (a resource of the package) or the folder given, as an
    absolute path ('.' has a name then); a folder whose write was killed between its two
    renames is put back first (`_recover`)."""
    text = str(name_or_path)
    known = f"known: {', '.join(profile_names()) or 'none'}, or a directory holding profile.toml"
    require(text.strip() != "", f"the profile is empty; give a profile name ({known})")
    if text in profile_names():
        return _shipped().joinpath(text)
    path = Path(os.path.abspath(text))
    if not path.exists() and old_versions(path):
        _recover(path)
    require(path.is_dir() and (path / "profile.toml").is_file(), f"unknown profile '{text}'; {known}")
    return path


def profile_folder(name_or_path: str | Path) -> Path:
    """Where a profile's files live on disk: a shipped profile's folder inside the
    installed package, or the directory given."""
    return Path(str(_profile_dir(name_or_path))).resolve()


def profile_lock(folder: Path | Traversable, shared: bool = False) -> AbstractContextManager[None]:
    """The lock on a profile folder: its parent folder's flock (writes.lock), which a
    write holds alone across its two renames and a reader shares while it loads, so a
    reader never sees the moment between them. Shipped profiles are never written."""
    if not isinstance(folder, Path) or not folder.parent.is_dir() or is_shipped(folder):
        return nullcontext()
    return lock(folder.parent, f"profile {folder}", shared=shared)


def is_shipped(folder: Path | Traversable) -> bool:
    """Whether a profile folder is one the package ships (read-only, never locked)."""
    return folder.name in profile_names() and str(folder) == str(_shipped().joinpath(folder.name))


def _recover(out: Path) -> None:
    """Put back a profile folder that a write killed between its two renames left beside
    itself as `.NAME.old-*` (nothing else is touched: a leftover `.NAME.new-*` stays)."""
    with profile_lock(out):
        olds = [p for p in old_versions(out) if (p / "profile.toml").is_file()]
        if out.exists() or not olds:
            return
        require(
            len(olds) == 1,
            f"profile {out} is missing and {len(olds)} earlier versions lie beside it "
            f"({', '.join(p.name for p in olds)}): rename the one to keep to {out.name}",
        )
        os.rename(olds[0], out)


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile (cached per process while its files are unchanged: a sweep loads
    and indexes the tables once), under its shared lock."""
    folder = _profile_dir(name_or_path)
    with profile_lock(folder, shared=True):
        return load_unlocked(folder)


def load_unlocked(folder: Path | Traversable) -> Profile:
    """A profile folder's profile, read by a caller that holds its lock (writing.py)."""
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


def shipped_meta() -> list[dict]:
    """The profile.toml of every shipped profile, without its tables: what the catalogue
    needs to find the one measured on a box (catalogue.py), at the cost of a few small reads."""
    root = _shipped()
    out = []
    for name in profile_names():
        f = root.joinpath(name).joinpath("profile.toml")
        out.append(parse_toml(read_text(Path(str(f)), "profile file"), str(f)))
    return out


def _checked_columns(f: Path, table: str, box: str) -> dict:
    """A profile table's columns, checked against the physics of the GPU of the box it was
    measured on (bounds.py) as they are read."""
    columns = cached_columns(f, table)
    check_tables({table: columns}, lambda t: str(f), datasheet(box))
    return columns


@lru_cache(maxsize=8)
def _load_profile(folder_text: str, _stamp: tuple) -> Profile:
    folder = Path(folder_text)
    meta_file = folder.joinpath("profile.toml")
    meta = parse_toml(read_text(meta_file, "profile file"), str(meta_file))
    params = check_meta(meta, str(meta_file))
    box = str(meta["box"])
    if box.endswith(".toml") and folder.joinpath(box).is_file():
        box = str(folder.joinpath(box))  # a box file written beside the profile (calibrate live)
    columns: dict = {}
    keys: dict = {}
    shipped = is_shipped(folder)
    for table in TABLE_COLUMNS:
        f = folder.joinpath(f"{table}.csv.gz")
        if f.is_file():
            # a user's table held to the physics of its GPU as the profile loads (bounds.py);
            # the package's own, which tests/test_bounds.py holds to the same bounds, read
            # only when a prediction first uses it
            columns[table] = partial(cached_columns, f, table) if shipped else _checked_columns(f, table, box)
            if (key := table_key(f)) is not None:
                keys[table] = key
    tables = Tables(columns=columns, keys=keys)
    measured: tuple[Point, ...] = ()
    f = folder.joinpath("measured.csv")
    if f.is_file():
        measured = tuple(read_points(f, str(f), str(meta.get("model", "kimi-k2.6")), str(meta["engine"])))
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


def check_meta(meta: dict, meta_file: str) -> Params:
    """A profile.toml's keys of the right types and its parameters within their bounds
    (read as it is loaded, and before a profile is written)."""
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
    return Params.from_dict(meta.get("params", {}), str(meta_file))

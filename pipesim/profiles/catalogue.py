"""The profile for a box asked for without one: a shipped profile measured on it, else
AIConfigurator's measured tables of its GPU, else first principles.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) measured kernels and
collectives of many GPUs, shipped in its `aiconfigurator-core` package under
`aiconfigurator_core/systems/data/<system>/<op>/<engine>/<version>/`. A box preset names
its system (`aiconfigurator_system` in the box TOML, docs/boxes.md). pipesim ships its own
derived tables of every system, engine and version that package measured (derived.py,
built by calibration/build_catalogue.py), so a plain install prices those boxes from
measurements; an installed `pipesim[catalogue]` is read instead only when it is newer
than the release they were derived from, or holds a system pipesim does not ship. Each
table is read at the newest engine version that measured it (or `--engine-version`), and
the profile's `table_sources` say which version each came from.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.errors import UserError, require
from ..inputs.box import Box
from . import derived
from .importers.aiconfigurator_layout import version_key

if TYPE_CHECKING:
    from .profile import Profile
    from .tables import Tables

CATALOGUE_EXTRA = "pip install 'pipesim[catalogue]'"
FIRST_PRINCIPLES = (
    "first principles: the roofline on the box's datasheet rates, kernels through the efficiency "
    "curves fitted on the measured GPUs (docs/roofline.md), collectives by NCCL's model on its links "
    "(calibrated on measured fabrics: docs/collectives.md)"
)
NCCL_MODEL = "NCCL's model on this box's links (calibrated on measured fabrics: docs/collectives.md)"


def data_root() -> Path | None:
    """AIConfigurator's systems/data folder, or None without the package (found
    without importing it: its import pulls in scipy and more)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"
    return root if root.is_dir() else None


def installed_version() -> str | None:
    """The installed aiconfigurator-core's version (None: not installed), from its metadata."""
    from importlib import metadata

    try:
        return metadata.version("aiconfigurator-core")
    except metadata.PackageNotFoundError:
        return None


def _shipped_for(box: Box, engine: str, model: str | None) -> str | None:
    """A shipped profile measured on this box with this engine: the one for this model,
    else the default profile, else any that is not a live profile of another model
    (a live profile measures one model's shapes only). Read from profile.toml alone."""
    from .profile import DEFAULT_PROFILE, shipped_meta

    metas = shipped_meta()
    found = [m["name"] for m in metas if m.get("box") == box.name and m.get("engine") == engine]
    by_model = {m["name"]: m.get("model") for m in metas}
    for name in found:
        if model is not None and by_model[name] == model:
            return name
    for name in found:
        if name == DEFAULT_PROFILE:
            return name
    for name in found:
        if not name.startswith("live-"):
            return name
    return None


@dataclass(frozen=True)
class Choice:
    """Where a box's costs come from: `kind` is "profile" (a shipped profile measured on
    the box, `name`), "shipped" (pipesim's derived tables of AIConfigurator system `name`),
    "installed" (built from the installed aiconfigurator-core) or "roofline"."""

    kind: str
    name: str = ""


def choose(box: Box, engine: str, model: str | None, version: str | None = None) -> Choice:
    """The source `profile_for_box` takes, decided without loading a table."""
    if version is None:
        shipped = _shipped_for(box, engine, model)
        if shipped:
            return Choice("profile", shipped)
    system = box.aiconfigurator_system
    if not system:
        return Choice("roofline")
    idx = derived.index(system)
    installed = installed_version() if data_root() is not None else None
    newer = installed is not None and (
        idx is None or version_key(installed) > version_key(idx["aiconfigurator_core"])
    )
    return Choice("installed" if newer else "shipped", system)


def profile_for_box(box: Box, engine: str, model: str | None, version: str | None = None) -> Profile:
    """The profile a run on `box` with `engine` uses when none is named."""
    from .profile import load_profile

    choice = choose(box, engine, model, version)
    if choice.kind == "profile":
        return load_profile(choice.name)
    if choice.kind == "roofline":  # the version then picks only the host loop's rules (build.py)
        return first_principles_profile(box, engine)
    if choice.kind == "shipped" and derived.index(choice.name) is not None:
        measured = measured_version(choice.name, engine, version)
        prof = _shipped_profile(choice.name, engine, measured)
        if measured != version:
            near = (
                f" (AIConfigurator did not measure {engine} {version}, the version asked: the newest tables)"
            )
            sources = {t: v + near for t, v in prof.meta["table_sources"].items()}
            prof = replace(prof, meta={**prof.meta, "table_sources": sources, "sources": sources})
    else:
        root = data_root()
        if root is None:
            raise UserError(
                f"box {box.name} is costed from AIConfigurator's measured {choice.name} tables, which pipesim "
                f"does not ship and are not installed: {CATALOGUE_EXTRA} (or name a profile with --profile)"
            )
        folder = root / choice.name
        require(
            folder.is_dir() and any(folder.iterdir()),
            f"box {box.name}: AIConfigurator {installed_version()} has no measurements of system {choice.name}",
        )
        prof = _catalogue_profile(str(folder), engine, version)
    if box.collectives_set_aside and "collectives" in prof.tables:
        prof = _without_collectives(prof, box)
    chassis = measured_chassis(choice.name)
    meta = {**prof.meta, **({"collectives_measured_on": chassis} if chassis else {})}
    return replace(prof, box=box.name, box_spec=box, meta=meta)


@cache
def measured_chassis(system: str) -> str | None:
    """The box preset that describes the chassis AIConfigurator measured `system`'s
    collectives in: the 8-GPU preset naming the system (its NCCL tables reach 8 GPUs).
    A box of another chassis naming the same system (a what-if's slower links, a 4-GPU
    box) has the bandwidth part of those tables rescaled to its own links against this
    one's (costs/collectives.py)."""
    from ..inputs.box import box_names, load_box

    for name in box_names():
        box = load_box(name)
        if box.aiconfigurator_system == system and box.gpu_count == 8 and box.nodes == 1:
            return name
    return None


def _without_collectives(prof: Profile, box: Box) -> Profile:
    """The system's kernels with its measured collectives set aside, as the box file says
    and why: its collectives then come from NCCL's model on the box's own links."""
    note = f"{NCCL_MODEL}; AIConfigurator's measured table set aside: {box.collectives_set_aside}"
    sources = {**prof.meta["table_sources"], "collectives": note}
    meta = {**prof.meta, "table_sources": sources, "sources": sources}
    return replace(prof, tables=prof.tables.without("collectives"), meta=meta)


def measured_version(system: str, engine: str, version: str | None) -> str | None:
    """The version whose shipped tables a run of `engine` `version` reads: that one when
    AIConfigurator measured it, else the newest tables (None), as without a version: the
    engine version itself picks the host loop's rules (profiles/hostloop.py)."""
    return version if version in derived.versions(system, engine) else None


def table_source(box: Box, engine: str, model: str | None = None) -> str:
    """One line: where a run on `box` with `engine` and no --profile takes its kernel and
    collective tables from (`pipesim boxes show`)."""
    from .profile import shipped_meta

    choice = choose(box, engine, model)
    metas = shipped_meta()
    if choice.kind == "profile":
        meta = next(m for m in metas if m["name"] == choice.name)
        return (
            f"shipped profile {choice.name}, measured on this box ({engine} {meta.get('engine_version', '')})"
        )
    live = [
        f"{m['model']}: shipped live profile {m['name']}"
        for m in metas
        if m.get("box") == box.name and m.get("engine") == engine and "model" in m and model is None
    ]
    return "; ".join([_tables_line(box, engine, choice)] + live)


def _tables_line(box: Box, engine: str, choice: Choice) -> str:
    if choice.kind == "roofline" and box.same_die_as:
        return FIRST_PRINCIPLES.replace(
            "fitted on the measured GPUs",
            f"fitted on AIConfigurator's {box.same_die_as} tables, the same die",
        )
    if choice.kind == "roofline":
        return FIRST_PRINCIPLES
    if choice.kind == "installed":
        return (
            f"AIConfigurator's measured {choice.name} tables from the installed aiconfigurator-core "
            f"{installed_version()} (newer than pipesim's shipped tables), derived when first used"
        )
    idx = derived.index(choice.name)
    if idx is None:
        return (
            f"AIConfigurator's measured {choice.name} tables: not shipped, and aiconfigurator-core is "
            f"not installed ({CATALOGUE_EXTRA})"
        )
    got = derived.load_tables(choice.name, engine, None)
    if got is None:
        return f"none: AIConfigurator measured no {engine} kernels of {choice.name}; " + FIRST_PRINCIPLES
    newest = _engine_version(got[1], engine)
    older = [v for v in derived.versions(choice.name, engine) if v != newest]
    return (
        f"AIConfigurator's measured {choice.name} tables, derived and shipped with pipesim "
        f"(aiconfigurator-core {idx['aiconfigurator_core']}, Apache-2.0): {engine} {newest}"
        + (f" (also --engine-version {', '.join(older)})" if older else "")
        + (f"; collectives by {NCCL_MODEL}: {box.collectives_set_aside}" if box.collectives_set_aside else "")
    )


def _engine_version(read: dict, engine: str) -> str:
    """The newest version of `engine` any table was read at ("sglang 0.5.14 gemm_perf + ...")."""
    found = {v.split()[1] for text in read.values() for v in text.split(" + ") if v.startswith(engine + " ")}
    return sorted(found, key=version_key)[-1] if found else ""


def _profile(system: str, engine: str, tables: Tables, read: dict, built_by: str) -> Profile:
    """A profile of AIConfigurator's tables of one system: the kernel floor is the
    shortest GEMM measured; the engine's custom all-reduce is read up to the largest group
    it measured (the custom rows beyond 2 PCIe GPUs are the engine's NCCL fallback,
    measured: importers/aiconfigurator.py)."""
    from .profile import Params, Profile

    gemm, coll = tables.columns("gemm"), tables.columns("collectives")
    custom = coll["gpus"][coll["impl"] == "custom"] if coll is not None else ()
    params = Params(
        kernel_floor_us=round(float(gemm["latency_ms"].min()) * 1e3, 3) if gemm is not None else 0.0,
        custom_allreduce_max_gpus=int(max(custom)) if len(custom) else 2,
    )
    version = _engine_version(read, engine)
    sources = {t: f"AIConfigurator {system} {v}" for t, v in read.items()}
    meta: dict[str, Any] = {
        "name": f"aiconfigurator-{system}-{engine}",
        "engine": engine,
        "engine_version": version,
        "built_by": built_by,
        "table_sources": sources,
        "sources": sources,
    }
    return Profile(meta["name"], "", engine, version, params, meta, tables)


def _no_kernels(system: str, engine: str) -> UserError:
    return UserError(
        f"AIConfigurator system {system} has no {engine} kernel tables; "
        f"try --engine {'sglang' if engine == 'vllm' else 'vllm'}"
    )


@lru_cache(maxsize=8)
def _shipped_profile(system: str, engine: str, version: str | None) -> Profile:
    """One shipped derived profile (once per process: a sweep indexes its tables once)."""
    from .tables import Tables

    got = derived.load_tables(system, engine, version)
    if got is None:
        have = derived.versions(system, engine)
        if version is None or not have:
            raise _no_kernels(system, engine)
        raise UserError(
            f"--engine-version {version}: AIConfigurator measured {system}'s {engine} kernels with "
            f"{', '.join(have)}; pick one of those"
        )
    columns, read, keys = got
    idx = derived.index(system)
    assert idx is not None  # load_tables found the system's index
    built_by = (
        f"pipesim's derived tables (calibration/build_catalogue.py) of aiconfigurator-core "
        f"{idx['aiconfigurator_core']}, shipped"
    )
    return _profile(system, engine, Tables(columns=columns, keys=keys), read, built_by)


@lru_cache(maxsize=8)
def _catalogue_profile(folder: str, engine: str, version: str | None) -> Profile:
    """The same profile built from the installed aiconfigurator-core (once per process)."""
    from .importers.aiconfigurator import build_tables
    from .tables import Tables

    read: dict = {}
    tables = build_tables(Path(folder), kernel_set=engine, version=version, versions=read)
    if not any(t in tables for t in ("gemm", "gqa_decode", "mla_decode")):
        raise _no_kernels(Path(folder).name, engine)
    built_by = f"pipesim catalogue (built from the installed aiconfigurator-core {installed_version()})"
    return _profile(Path(folder).name, engine, Tables(tables), read, built_by)


def first_principles_profile(box: Box, engine: str) -> Profile:
    """No table for this GPU: every cost from the roofline (costs.py) on the box's
    datasheet rates, kernels through the efficiency curves fitted on measured GPUs
    (roofline.py, docs/roofline.md)."""
    from .profile import Params, Profile
    from .tables import Tables

    die = box.same_die_as
    fitted_on = f"on AIConfigurator's {die} tables (the same die)" if die else "on measured GPUs"
    meta: dict[str, Any] = {
        "name": f"first-principles-{box.name}",
        "engine": engine,
        "built_by": "pipesim catalogue (no measured tables: roofline)",
        "table_sources": {
            "all": f"roofline on the box's datasheet rates, kernel efficiency fitted {fitted_on} "
            "(no measured table for this GPU; docs/roofline.md)"
        },
        **({"same_die_as": die} if die else {}),
    }
    return Profile(meta["name"], box.name, engine, "", Params(), meta, Tables(), box_spec=box)

"""The profile for a box asked for without one: a shipped profile measured on it, else
one built from AIConfigurator's measured silicon data for its GPU (pipesim[catalogue]),
else first principles.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) ships per-GPU kernel
and NCCL tables in its `aiconfigurator-core` package, under
`aiconfigurator_core/systems/data/<system>/<op>/<engine>/<version>/`. A box preset
names its system (`aiconfigurator_system` in the box TOML, docs/boxes.md); the tables
are read at the newest engine version that measured each (or `--engine-version`), and
the profile's `table_sources` say which version each came from. Built once per process
per (system, engine, version).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.errors import UserError, require
from ..inputs.box import Box

if TYPE_CHECKING:
    from .profile import Profile

CATALOGUE_EXTRA = "pip install 'pipesim[catalogue]'"


def data_root() -> Path | None:
    """AIConfigurator's systems/data folder, or None without the package (found
    without importing it: its import pulls in scipy and more)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"
    return root if root.is_dir() else None


def _shipped_for(box: Box, engine: str, model: str) -> str | None:
    """A shipped profile measured on this box with this engine: the one for this model,
    else the default profile, else any that is not a live profile of another model
    (a live profile measures one model's shapes only)."""
    from .profile import DEFAULT_PROFILE, load_profile, profile_names

    found = [p for p in map(load_profile, profile_names()) if p.box == box.name and p.engine == engine]
    for p in found:
        if p.meta.get("model") == model:
            return p.name
    for p in found:
        if p.name == DEFAULT_PROFILE:
            return p.name
    for p in found:
        if not p.name.startswith("live-"):
            return p.name
    return None


def profile_for_box(box: Box, engine: str, model: str, version: str | None = None) -> Profile:
    """The profile a run on `box` with `engine` uses when none is named."""
    from .profile import load_profile

    if version is None:
        shipped = _shipped_for(box, engine, model)
        if shipped:
            return load_profile(shipped)
    system = box.aiconfigurator_system
    if system:
        root = data_root()
        require(
            root is not None,
            f"box {box.name} is costed from AIConfigurator's measured {system} tables, "
            f"which are not installed: {CATALOGUE_EXTRA} (or name a profile with --profile)",
        )
        folder = root / system
        require(
            folder.is_dir() and any(folder.iterdir()),
            f"box {box.name}: AIConfigurator {root.parent.parent.name} has no measurements of system {system}",
        )
        return replace(_catalogue_profile(str(folder), engine, version), box=box.name, box_spec=box)
    require(
        version is None,
        f"--engine-version {version}: box {box.name} has no measured tables to pick a version of",
    )
    return first_principles_profile(box, engine)


@lru_cache(maxsize=8)
def _catalogue_profile(folder: str, engine: str, version: str | None):
    from .importers.aiconfigurator import build_tables, kernel_floor_us
    from .importers.aiconfigurator_layout import version_key
    from .profile import Params, Profile
    from .tables import Tables

    versions: dict = {}
    tables = build_tables(Path(folder), kernel_set=engine, version=version, versions=versions)
    if not any(t in tables for t in ("gemm", "gqa_decode", "mla_decode")):
        raise UserError(
            f"AIConfigurator system {Path(folder).name} has no {engine} kernel tables; "
            f"try --engine {'sglang' if engine == 'vllm' else 'vllm'}"
        )
    engine_versions = sorted(
        {v.split()[1] for v in " + ".join(versions.values()).split(" + ") if v.startswith(engine + " ")},
        key=version_key,
    )
    custom = tables.get("collectives")
    custom_gpus = custom[custom["impl"] == "custom"]["gpus"] if custom is not None else []
    params = Params(
        kernel_floor_us=kernel_floor_us(tables),
        # the custom rows beyond 2 PCIe GPUs are the engine's NCCL fallback, measured
        # (importers/aiconfigurator.py), so reading them up to the largest group is right
        custom_allreduce_max_gpus=int(max(custom_gpus)) if len(custom_gpus) else 2,
    )
    system = Path(folder).name
    meta = {
        "name": f"aiconfigurator-{system}-{engine}",
        "engine": engine,
        "engine_version": engine_versions[-1] if engine_versions else "",
        "built_by": "pipesim catalogue (AIConfigurator measured tables)",
        "table_sources": {t: f"AIConfigurator {system} {v}" for t, v in versions.items()},
        "sources": {t: f"AIConfigurator {system} {v}" for t, v in versions.items()},
    }
    return Profile(meta["name"], "", engine, meta["engine_version"], params, meta, Tables(tables))


def first_principles_profile(box: Box, engine: str) -> Profile:
    """No table for this GPU: every cost from the roofline (costs.py) on the box's
    datasheet rates, kernels through the efficiency curves fitted on measured GPUs
    (roofline.py, docs/roofline.md)."""
    from .profile import Params, Profile
    from .tables import Tables

    meta = {
        "name": f"first-principles-{box.name}",
        "engine": engine,
        "built_by": "pipesim catalogue (no measured tables: roofline)",
        "table_sources": {
            "all": "roofline on the box's datasheet rates, kernel efficiency fitted on measured GPUs "
            "(no measured table for this GPU; docs/roofline.md)"
        },
    }
    return Profile(meta["name"], box.name, engine, "", Params(), meta, Tables(), box_spec=box)

"""pipesim's own derived tables of AIConfigurator's measured GPUs, shipped with the package.

AIConfigurator (github.com/ai-dynamo/aiconfigurator, Apache-2.0) measures kernels and
collectives of many GPUs; its `aiconfigurator-core` package holds them as some 80 MB of
parquet, and turning one GPU's into pipesim's tables (importers/aiconfigurator.py) costs
seconds of CPU per process. `calibration/build_catalogue.py` does that once, for every
GPU, engine (SGLang, vLLM) and engine version the package measured, and writes only what
pipesim reads: the narrow tables of `tables.TABLE_COLUMNS`, as numpy columns in
compressed .npz files (the form of the parsed-table cache, so a load is a decompression,
not a parse). A table two versions share is stored once (files are named by a hash of
their content). Each GPU (AIConfigurator system) is a folder

    <system>/index.json    the data's source and licence, and per profile ("sglang" = each
                           table at its newest version, "sglang 0.5.10" = the tables
                           measured with that version) its tables: file and version read
    <system>/<table>-<hash>.npz

installed as the package `pipesim.data.catalogue` (the repository's calibration/catalogue).
The files are checked when they are built; a load trusts them, as the cache does.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from functools import lru_cache, partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from importlib.abc import Traversable

    import pandas as pd

from .tables import TABLE_COLUMNS, TEXT_COLUMNS

INDEX = "index.json"
FORMAT = 1  # of index.json and the .npz columns


def _root() -> Traversable:
    """The shipped catalogue: the installed package `pipesim.data.catalogue`, or
    calibration/catalogue beside the source when pipesim runs uninstalled."""
    try:
        return resources.files("pipesim.data.catalogue")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "calibration" / "catalogue"


@lru_cache(maxsize=1)
def systems() -> tuple[str, ...]:
    """The AIConfigurator systems (GPUs) whose derived tables pipesim ships."""
    root = _root()
    if not root.is_dir():
        return ()
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and p.joinpath(INDEX).is_file()))


@lru_cache(maxsize=32)
def index(system: str) -> dict | None:
    """One system's index (module docstring), or None when pipesim ships none for it."""
    if system not in systems():
        return None
    return json.loads(_root().joinpath(system).joinpath(INDEX).read_text())


def profile_key(engine: str, version: str | None) -> str:
    """The index's key of a profile: the engine (each table at its newest version), or
    the engine and one version (the tables measured with it)."""
    return engine if version is None else f"{engine} {version}"


def versions(system: str, engine: str) -> list[str]:
    """The engine versions of `system` with a shipped profile, oldest first (index order)."""
    idx = index(system) or {}
    return [k.split(" ", 1)[1] for k in idx.get("profiles", {}) if k.startswith(engine + " ")]


@lru_cache(maxsize=64)
def _columns(system: str, file: str) -> dict[str, np.ndarray]:
    with _root().joinpath(system).joinpath(file).open("rb") as fh, np.load(fh, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def load_tables(system: str, engine: str, version: str | None) -> tuple[dict, dict, dict] | None:
    """(table -> a function returning its numpy columns, read when first called and then
    kept; table -> the version it was measured with; table -> a key naming its content,
    for its stored lookups, stored_lookups.py) of one shipped profile, or None when it
    is not shipped."""
    entry = (index(system) or {}).get("profiles", {}).get(profile_key(engine, version))
    if entry is None:
        return None
    tables = {t: partial(_columns, system, e["file"]) for t, e in entry["tables"].items()}
    # a file's name holds a hash of its content
    keys = {t: f"catalogue|{FORMAT}|{system}|{e['file']}" for t, e in entry["tables"].items()}
    return tables, {t: e["version"] for t, e in entry["tables"].items()}, keys


# ---- writing (calibration/build_catalogue.py) ------------------------------------------------


def _npz(table: str, df: pd.DataFrame) -> tuple[bytes, str]:
    """One table as compressed numpy columns (keys and latency_ms only, in TABLE_COLUMNS'
    order; text as fixed-width unicode, no pickles) and the hash of its content."""
    cols = {}
    for c in TABLE_COLUMNS[table] + ("latency_ms",):
        v = df[c].to_numpy()
        cols[c] = (
            v.astype(str) if c in TEXT_COLUMNS else v.astype(np.float64 if c == "latency_ms" else np.int64)
        )
    digest = hashlib.sha256()
    for c, v in cols.items():
        digest.update(f"{c}|{v.dtype.str}|{len(v)}|".encode())
        digest.update(np.ascontiguousarray(v).tobytes())
    buf = io.BytesIO()
    # the stubs match the columns against savez_compressed's own allow_pickle keyword too
    np.savez_compressed(buf, **cols)  # type: ignore[arg-type]
    return buf.getvalue(), digest.hexdigest()[:16]


def write_system(folder: Path, system: str, source: dict, profiles: Mapping[str, tuple[dict, dict]]) -> int:
    """Write one system's folder: `profiles` maps each index key (`profile_key`) to
    (table -> DataFrame, table -> version read). Files no profile names are removed.
    Returns the folder's size in bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries, files = {}, {}
    for key, (tables, read) in profiles.items():
        entry = {}
        for table, df in tables.items():
            data, digest = _npz(table, df)
            name = f"{table}-{digest}.npz"
            files[name] = data
            entry[table] = {"file": name, "version": read[table], "rows": len(df)}
        entries[key] = {"tables": entry}
    for name, data in files.items():
        path = folder / name
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
    for stale in folder.glob("*.npz"):
        if stale.name not in files:
            stale.unlink()
    doc = {"format": FORMAT, "system": system, **source, "profiles": entries}
    (folder / INDEX).write_text(json.dumps(doc, indent=1) + "\n")
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())

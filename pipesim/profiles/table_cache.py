"""The parsed-table cache: a profile table's checked columns kept as .npz under the
cache folder (PIPESIM_CACHE_DIR, default ~/.cache/pipesim), keyed by the file's path,
size and modification time, so a second process reads numpy columns instead of
parsing the CSV again (tables.read_columns)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..base.errors import UserError
from ..base.writes import write_atomic
from .tables import read_columns

if TYPE_CHECKING:
    from importlib.abc import Traversable

CACHE_VERSION = 1  # of the parsed-table cache's layout (`cached_columns`)
CACHE_MIN_BYTES = 64 * 1024  # smaller table files parse in milliseconds: not worth a cached copy
CACHE_MAX_FILES = 64  # cached tables kept, the most recently used (a copied profile is a new key)
CACHED_NAME = re.compile(r"[a-z_]+-[0-9a-f]{24}\.npz")  # a cached table's file (`cached_columns`)


def _cache_dir() -> Path:
    return Path(os.environ.get("PIPESIM_CACHE_DIR") or Path.home() / ".cache" / "pipesim")


def table_key(f: Path | Traversable) -> str | None:
    """A table file's key in the cache: its path, size and modification time (None: a
    file that cannot be stat'ed)."""
    try:
        st = Path(str(f)).stat()
    except OSError:
        return None
    return f"{Path(str(f)).resolve()}|{st.st_size}|{st.st_mtime_ns}"


def cached_columns(f: Path | Traversable, table: str) -> dict[str, np.ndarray]:
    """A table's checked columns, kept as .npz under the cache folder (PIPESIM_CACHE_DIR,
    default ~/.cache/pipesim) keyed by the file's path, size and modification time:
    parsing the largest tables costs more than the rest of a prediction, a cached read
    a few milliseconds. The cache is only ever a copy; a folder that cannot be written
    is skipped, and files under CACHE_MIN_BYTES are parsed each time. It holds at most
    CACHE_MAX_FILES tables: a read marks its copy used, a write drops the least
    recently used beyond that (every copy of a profile's folder is keyed anew)."""
    try:
        if Path(str(f)).stat().st_size < CACHE_MIN_BYTES:
            raise OSError("small table: parsed each time")
        key = hashlib.sha256(f"{table_key(f)}|{CACHE_VERSION}".encode()).hexdigest()[:24]
        cached = _cache_dir() / f"{table}-{key}.npz"
    except OSError:
        cached = None
    if cached is not None and cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as z:
                cols = {name: z[name] for name in z.files}
            os.utime(cached)
            return cols
        except Exception:
            pass
    with f.open("rb") as fh:
        cols = read_columns(fh, table, str(f))
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(cached, lambda tmp: np.savez(tmp, **cols))  # type: ignore[arg-type]  # stubs: cols vs allow_pickle
            _trim_cache(cached.parent)
        except (OSError, UserError):  # a cache folder that cannot be written (or a link): no copy
            pass
    return cols


def _trim_cache(folder: Path) -> None:
    """Drop the least recently used cached tables beyond CACHE_MAX_FILES."""
    entries = []
    for p in folder.glob("*.npz"):
        if not CACHED_NAME.fullmatch(p.name):  # only the cache's own copies: a user's file stays
            continue
        try:
            entries.append((p.stat().st_mtime_ns, p))
        except OSError:  # removed meanwhile by another process
            continue
    entries.sort(reverse=True)
    for _, p in entries[CACHE_MAX_FILES:]:
        p.unlink(missing_ok=True)

"""A profile's table lookups (tables.Tables.gemm, .moe, ...: curves and surfaces indexed
by shape) kept on disk once built, so that a prediction reads them back instead of
sorting and grouping tens of thousands of rows in every process."""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from ..base.cache import cache_folder

FORMAT = 1  # of the stored files
MAX_FILES = 64  # stored lookups kept, the most recently used (as the parsed tables)


@lru_cache(maxsize=1)
def _lookup_version() -> str:
    """What a stored lookup was built by: this file, tables.py (which builds them) and
    curves.py (they are pickles of its classes), and the files' layout."""
    h = hashlib.sha256(f"{FORMAT}".encode())
    for p in (Path(__file__), Path(__file__).with_name("tables.py"), Path(__file__).with_name("curves.py")):
        h.update(p.read_bytes())
    return h.hexdigest()


def stored_lookup(table: str, key: str, build: Callable[[], dict]) -> dict:
    """A table's lookups (Tables.gemm, .moe, ...: curves and surfaces indexed by shape),
    built once and kept under the cache folder as a pickle keyed by the table's `key`
    and the code that builds them: a prediction reads them back in a millisecond or two
    instead of sorting and grouping tens of thousands of rows in every process (the
    GEMM table's 71,484). The same rules as the columns' cache: only ever a copy, read
    only from the user's own cache folder, a damaged file rebuilt, an unwritable folder
    skipped, at most MAX_FILES kept."""
    name = hashlib.sha256(f"{table}|{key}|{_lookup_version()}".encode()).hexdigest()[:24]
    stored = cache_folder() / f"lookup-{table}-{name}.pkl"
    try:
        with stored.open("rb") as fh:
            out = pickle.load(fh)
        os.utime(stored)
        return out
    except Exception:  # not stored yet, removed meanwhile, or damaged: build it
        pass
    out = build()
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        tmp = stored.with_suffix(f".{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            pickle.dump(out, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, stored)
        _trim(stored.parent)
    except OSError:
        pass
    return out


def _trim(folder: Path) -> None:
    """Drop the least recently used stored lookups beyond MAX_FILES."""
    entries = []
    for p in folder.glob("lookup-*.pkl"):
        try:
            entries.append((p.stat().st_mtime_ns, p))
        except OSError:  # removed meanwhile by another process
            continue
    for _, p in sorted(entries, reverse=True)[MAX_FILES:]:
        p.unlink(missing_ok=True)

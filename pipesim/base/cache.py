"""Simulated results kept on disk, so that a command run again on what did not change
does not simulate it again (the corpus check, the tornado).

A value is stored as results/<key>.pkl under the cache folder (PIPESIM_CACHE_DIR,
default ~/.cache/pipesim, the folder of the parsed tables). Its key is a SHA-256 of
what decides it: pipesim's version and a digest of its code and data files
(`code_version`: an edited source file is another version), and the caller's parts, for
a simulation its scenario's fingerprint (scenario/fingerprint.py) and how it was run.
A changed scenario, a changed pipesim or another way of running is another key: a miss.

The cache is only ever a copy. Every write is atomic (a temporary file renamed), so
processes that share the folder (a pool's workers, a parallel test suite) never read
half a file; a file that cannot be read is a miss; a folder that cannot be written is
skipped. It holds at most MAX_RESULTS files: a read marks its file used, a write drops
the least recently used beyond that. The files are pickles, read back only from the
user's own cache folder, as the parsed tables are.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from functools import lru_cache
from pathlib import Path

MAX_RESULTS = 4096  # the corpus check's runs by two paths, several times over
FORMAT = 1  # of the stored files: a new layout is a new key
# what a version digest reads: the code, and the data that is not a profile's tables
# (a scenario's fingerprint holds the tables it reads)
VERSIONED = ("*.py", "*.json", "*.toml")


def cache_folder() -> Path:
    """The cache folder: PIPESIM_CACHE_DIR, else ~/.cache/pipesim."""
    return Path(os.environ.get("PIPESIM_CACHE_DIR") or Path.home() / ".cache" / "pipesim")


@lru_cache(maxsize=1)
def code_version() -> str:
    """pipesim's version and a digest of its package's code and data files, read once
    per process (a few milliseconds)."""
    from .. import __version__

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(f"{__version__}|{FORMAT}".encode())
    files = sorted({p for pattern in VERSIONED for p in root.rglob(pattern) if "__pycache__" not in p.parts})
    for p in files:
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def result_key(*parts: str) -> str:
    """The key of a value decided by `parts` (and pipesim's code_version)."""
    h = hashlib.sha256(code_version().encode())
    for part in parts:
        h.update(b"\0" + part.encode())
    return h.hexdigest()


class ResultCache:
    """A folder of stored values by key (module docstring); `enabled=False` stores
    nothing and finds nothing."""

    def __init__(self, folder: str | Path | None = None, enabled: bool = True) -> None:
        self.folder = Path(folder) if folder is not None else cache_folder() / "results"
        self.enabled = enabled
        self.hits = self.misses = 0

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.pkl"

    def get(self, key: str) -> object | None:
        """The value stored under `key`, or None (a miss)."""
        if not self.enabled:
            return None
        path = self._path(key)
        try:
            with path.open("rb") as f:
                value = pickle.load(f)
            os.utime(path)
        except Exception:  # missing, half-removed by another process's trim, or unreadable
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, key: str, value: object) -> None:
        """Store `value` under `key` (skipped where the folder cannot be written)."""
        if not self.enabled:
            return
        path = self._path(key)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
            self._trim()
        except OSError:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:  # no folder to hold it
                pass

    def _trim(self) -> None:
        files = list(self.folder.glob("*.pkl"))
        if len(files) <= MAX_RESULTS:
            return
        by_use = []
        for f in files:
            try:
                by_use.append((f.stat().st_mtime_ns, f))
            except OSError:
                continue
        for _, f in sorted(by_use)[: len(by_use) - MAX_RESULTS]:
            f.unlink(missing_ok=True)

"""Writes that never harm a user's file, and the locks that keep two pipesim processes
from writing one file at once. Every file and folder pipesim writes goes through here.

- A target is checked before any work (`check_target`): not a symbolic link (writing
  through it would change the file it points to, replacing it would lose the link),
  not a folder, not one of the command's own input files, in a folder that exists.
- A file is written to a new temporary name beside it, created by this call
  (`mkstemp`: O_EXCL), and renamed over the target only when whole (`write_files`:
  several files all or none); a folder likewise (`write_folder`). Only the paths the
  call itself created are ever removed: a leftover of another run, or a user's
  `.NAME.old`, is never touched.
- While a write is under way SIGTERM raises `Terminated` where the process is, as
  Ctrl-C raises KeyboardInterrupt, so the write's cleanup runs on both
  (`cleanup_on_signals`). Only SIGKILL (or a power cut) can leave a hidden temporary.
- A file or folder that several processes may write (a profile, a sweep's part file)
  is locked with the operating system's advisory lock, fcntl.flock (`lock`,
  `lock_fd`): readers share it, a writer holds it alone. flock rather than a lock
  library: it gives shared and exclusive modes on the file or folder itself (no lock
  file left behind, none to clean up), and the kernel drops it when its process dies,
  so a killed writer never leaves a stale lock (filelock's Unix lock is the same call
  without the shared mode). Where fcntl does not exist (Windows) nothing is locked.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from .errors import UserError, require

LOCK_WAIT_S = 60.0  # how long a profile write or read waits for another process's write
LOCK_POLL_S = 0.05


class Terminated(KeyboardInterrupt):
    """SIGTERM while pipesim writes: raised where the process was, so that every
    write's cleanup runs (as Ctrl-C's KeyboardInterrupt does)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` (SIGINT raises KeyboardInterrupt already).
    Only the main thread can take a signal handler, and a handler the program installed
    itself is left alone; nested uses share the outermost one."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def input_paths(**values: object) -> dict[str, Path]:
    """The inputs among a command's values (role -> value) that name existing files: what
    an output must never be written over."""
    out = {}
    for role, v in values.items():
        if isinstance(v, (str, Path)) and str(v) and Path(v).is_file():
            out[role] = Path(v)
    return out


def check_target(path: str | Path, what: str, inputs: Mapping[str, Path] | None = None) -> Path:
    """An output file's path, checked before any work: not a symbolic link, not a folder,
    not one of `inputs` (role -> path: the command's own input files), its folder there."""
    out = Path(path)
    if out.is_symlink():
        raise UserError(
            f"{what} file '{out}' is a symbolic link (to '{os.readlink(out)}'); pipesim does not write "
            "through links: give the path it points to, or another name"
        )
    require(not out.is_dir(), f"{what} file '{out}' is a folder; give a file name")
    parent = out.parent if str(out.parent) else Path(".")
    require(parent.is_dir(), f"directory '{parent}' of the {what} file does not exist")
    if out.exists():
        for role, p in (inputs or {}).items():
            if p.exists() and os.path.samefile(out, p):
                raise UserError(
                    f"{what} file '{out}' is this command's {role} input; writing it would replace that "
                    "input: give another output name"
                )
    return out


def write_files(targets: Sequence[tuple[Path, Callable[[Path], object]]]) -> list[Path]:
    """Write several files all or none: each `write(tmp)` fills a new temporary file beside
    its target, then all are renamed into place. On any error, Ctrl-C or SIGTERM the
    temporaries this call made are removed and no target is touched."""
    temps: list[Path] = []
    with cleanup_on_signals():
        try:
            for path, write in targets:
                fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
                os.close(fd)
                temps.append(Path(name))
                write(Path(name))
                os.chmod(name, 0o644)
            for path, _ in targets:
                # checked before the work; checked again here, where the rename would replace a link
                require(not path.is_symlink(), f"'{path}' became a symbolic link while pipesim wrote it")
            for (path, _), tmp in zip(targets, temps):
                os.replace(tmp, path)
        finally:
            for tmp in temps:
                tmp.unlink(missing_ok=True)  # renamed ones are gone already
    return [path for path, _ in targets]


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call write(temporary path) in the same directory, then rename it over `path`."""
    return write_files([(Path(path), write)])[0]


def write_folder(out: Path, fill: Callable[[Path], object]) -> Path:
    """Replace folder `out` so that a reader sees the old one or the whole new one:
    `fill(tmp)` fills a new `.NAME.new-*` folder; once complete, the old folder is renamed
    to a new `.NAME.old-*` and the new one into place, then the old one removed. On an
    error, Ctrl-C or SIGTERM the new folder is removed and the old one put back. The
    caller holds the folder's lock (`lock`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with cleanup_on_signals():
        tmp: Path | None = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
        old: Path | None = None
        try:
            assert tmp is not None
            tmp.chmod(0o755)
            fill(tmp)
            if out.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
                os.rename(out, old)  # onto the empty folder just made
            os.rename(tmp, out)
            tmp = None
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                if out.exists():
                    os.rmdir(old)  # the rename aside never happened: the empty folder made for it
                else:
                    os.rename(old, out)
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def old_versions(out: Path) -> list[Path]:
    """Earlier versions of folder `out` that a killed `write_folder` left beside it
    (`.NAME.old-*`, and `.NAME.old` of pipesim before 0.2)."""
    if not out.parent.is_dir():
        return []
    found = sorted(out.parent.glob(f".{out.name}.old-*")) + [out.with_name(f".{out.name}.old")]
    return [p for p in found if p.is_dir() and not p.is_symlink()]


def flock(fd: int, what: str, *, shared: bool = False, wait_s: float | None = None) -> None:
    """Take flock on an open file or folder: shared (readers) or alone (a writer); closing
    the descriptor lets go. Waits up to `wait_s` for another process's hold (0: not at
    all; None: LOCK_WAIT_S), then one line of error."""
    try:
        import fcntl
    except ImportError:  # no flock on this system (docs/bad-input.md)
        return
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    for attempt in range(int(wait_s / LOCK_POLL_S) + 1):
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt * LOCK_POLL_S >= wait_s:
                break
            time.sleep(LOCK_POLL_S)
    raise UserError(
        f"{what} is being written by another pipesim process"
        + (f" (waited {wait_s:g} s)" if wait_s else "")
        + "; wait for it to finish, or write elsewhere"
    )


@contextmanager
def lock(path: Path, what: str, *, shared: bool = False, wait_s: float | None = None) -> Iterator[None]:
    """Hold flock on an existing file or folder (`flock`), opened without following a link,
    while inside."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        flock(fd, what, shared=shared, wait_s=wait_s)
        yield
    finally:
        os.close(fd)

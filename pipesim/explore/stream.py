"""A sweep table written as its scenarios finish, and resumed after an interruption.

Rows go to a part file beside the output, `OUT.part` (CSV, whatever OUT's format), one
line per finished scenario, appended and flushed in one write: a kill leaves every
finished row and at most a partial last line, which a resume cuts off. When the sweep
ends, the whole table is written to OUT at once (`files.write_table`: a reader sees the
old OUT or the new one) and the part file is removed.

Each row carries its sweep's options (OPTIONS_COLUMN: the JSON of every input that is not
one of the sweep's lists), so a resume with other options is refused rather than mixing
two sweeps in one table, and its key (grid.KEY_COLUMNS), so a resume runs exactly the
scenarios not yet in the file.

A file written before some of this version's columns (the slots by position, say) is
widened when the first new row comes: its rows keep their values and leave the new
columns empty (not measured by the version that ran them), the part file is rewritten
once with the new header, and the sweep goes on. A file with a column this version does
not write is refused.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.checks import MAX_SWEEP_SCENARIOS, MAX_SWEEP_TABLE_BYTES, read_bounded
from ..base.errors import UserError, require
from ..base.files import check_table, csv_kwargs, read_table
from ..base.writes import flock, write_atomic
from .grid import KEY_COLUMNS, row_key

if TYPE_CHECKING:
    import pandas as pd

OPTIONS_COLUMN = "sweep_options"
PART_SUFFIX = ".part"


def part_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + PART_SUFFIX)


def options_text(kwargs: dict, run_kwargs: dict, open_loop: bool) -> str:
    """The sweep's options as one JSON line, the same for the same inputs however they were
    given: arguments equal to build_scenario's defaults are left out, objects (a Profile, a
    Model) are named with their parameters, and the pipesim version is included."""
    import inspect
    from importlib.metadata import version

    from ..scenario.build import build_scenario

    defaults = {
        k: p.default
        for k, p in inspect.signature(build_scenario).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    opts = {
        k: _plain(v) for k, v in kwargs.items() if v is not None and not (k in defaults and v == defaults[k])
    }
    opts.update({k: _plain(v) for k, v in run_kwargs.items() if v is not None})
    opts["load"] = "rate_rps" if open_loop else "conc"
    opts["pipesim"] = version("pipesim")
    return json.dumps(opts, sort_keys=True, separators=(",", ":"), default=repr)


def _plain(value: object) -> object:
    """A value JSON can hold: a Profile or Model object by its name and parameters."""
    if isinstance(value, (str, int, float, bool)):
        return value
    params = getattr(value, "params", None)
    if hasattr(value, "name") and is_dataclass(params) and not isinstance(params, type):
        return {
            "name": value.name,
            "params": asdict(params),
            "foreign": getattr(value, "foreign", None),
        }
    if hasattr(value, "name"):
        return {"name": value.name, "value": repr(value)}
    return repr(value)


def _differs(mine: str, theirs: str) -> str:
    """'seed: 1 in the file, default now' for the first option two JSON option lines differ in."""
    try:
        a, b = json.loads(mine), json.loads(theirs)
    except (json.JSONDecodeError, TypeError):
        return f"options {str(theirs)[:80]!r} in the file"
    if not isinstance(b, dict):
        return f"options {str(theirs)[:80]!r} in the file"
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            return f"{k}: {_shown(b, k)} in the file, {_shown(a, k)} now"
    return "the same options written differently"


def _shown(options: dict, k: str) -> str:
    return "default" if k not in options else json.dumps(options[k])[:60]


def done_rows(out: str | Path, options: str, resume: bool) -> tuple[pd.DataFrame | None, PartFile | None]:
    """(the rows a sweep writing `out` has already, its part file held): with `resume`, the
    rows of the part file (its whole lines; the file opened and locked for this sweep,
    nothing cut or written yet) or, without one, of a finished OUT; (None, None) if there
    are none. Without `resume`, a part file is refused: one a running sweep holds, or
    one an interrupted sweep left (its rows would be lost). Every row must be one of this
    sweep's options, each key once."""
    out, part = Path(out), part_path(out)
    if not resume:
        if os.path.lexists(part):
            _no_link(part)
            PartFile.open(part, out).close()  # refused here when another sweep holds it
            raise UserError(
                f"{part} holds the rows of an interrupted sweep; pass --resume to finish it, or remove the "
                "file to start again"
            )
        return None, None
    held: PartFile | None = None
    if os.path.lexists(part):
        _no_link(part)
        held = PartFile.open(part, out)
        try:
            df = held.table()
        except BaseException:
            held.close()
            raise
        where = part
    elif out.exists():
        df = read_table(out)
        where = out
    else:
        return None, None
    try:
        return _checked(df, where, options), held
    except BaseException:
        if held is not None:
            held.close()
        raise


def _no_link(part: Path) -> None:
    if part.is_symlink():
        raise UserError(
            f"{part} is a symbolic link (to '{os.readlink(part)}'); a sweep's part file is its own: remove the "
            "link or write another --out"
        )
    require(part.is_file(), f"{part} is not a file; remove it or write another --out")


def _checked(df: pd.DataFrame, where: Path, options: str) -> pd.DataFrame:
    require(
        OPTIONS_COLUMN in df.columns,
        f"--resume: {where} has no column {OPTIONS_COLUMN}, so its sweep's options are unknown; write a new --out",
    )
    if "dp" not in df.columns:  # written before data-parallel splits: every row is dp 1
        df = df.assign(dp=1)
    missing = [c for c in KEY_COLUMNS if c not in df.columns]
    require(not missing, f"--resume: {where} has no column(s) {', '.join(missing)}; write a new --out")
    seen: dict[tuple, int] = {}
    for i, (row, opts) in enumerate(
        zip(df[list(KEY_COLUMNS)].to_dict("records"), df[OPTIONS_COLUMN], strict=True)
    ):
        line = i + 2  # the header is line 1
        if opts != options:
            raise UserError(
                f"--resume: {where} line {line} was written by a sweep with other options "
                f"({_differs(options, opts)}); give the same options, or write a new --out"
            )
        try:
            key = row_key(row)
        except (TypeError, ValueError):
            raise UserError(f"--resume: {where} line {line}: its scenario key {row} is not valid") from None
        require(
            key not in seen,
            f"--resume: {where} line {line} repeats the scenario of line {seen.get(key)}; write a new --out",
        )
        seen[key] = line
    return df


class PartFile:
    """A sweep's part file, open and locked alone for the whole sweep (writes.lock_fd, not
    waiting): a second sweep on the same OUT is refused instead of mixing its rows in.
    Opened without following a link; created only by a sweep (O_EXCL), and removed only
    by the sweep that finishes it, or, still empty, by the one that created it."""

    def __init__(self, part: Path, fd: int, created: bool) -> None:
        self.part, self.fd, self.created = part, fd, created
        self.whole = 0  # bytes of whole lines read (a resume appends after them)

    @classmethod
    def open(cls, part: Path, out: Path, create: bool = False) -> PartFile:
        flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | ((os.O_CREAT | os.O_EXCL) if create else 0)
        try:
            fd = os.open(part, flags, 0o644)
        except FileExistsError:
            raise UserError(
                f"another pipesim sweep started writing {out} meanwhile; write another --out"
            ) from None
        held = cls(part, fd, create)
        try:
            flock(fd, f"the sweep table {out} ({part.name})", wait_s=0)
        except BaseException:
            held.close()
            raise
        return held

    def table(self) -> pd.DataFrame:
        """The file's whole lines as a table, checked as a sweep table is (a partial last
        line, left by a kill, is cut off only when the sweep goes on: `start`)."""
        import io

        import pandas as pd

        with os.fdopen(os.dup(self.fd), "rb") as fh:
            data = read_bounded(fh, str(self.part), MAX_SWEEP_TABLE_BYTES, MAX_SWEEP_SCENARIOS)
        self.whole = data.rfind(b"\n") + 1
        require(
            self.whole > 0,
            f"{self.part} has no whole line (not even a header); remove it and run the sweep again",
        )
        try:
            df = pd.read_csv(io.BytesIO(data[: self.whole]), **csv_kwargs())
        except Exception as exc:  # pandas raises many types for a malformed file
            raise UserError(
                f"{self.part}: cannot read as CSV ({type(exc).__name__}); remove it to start again"
            ) from None
        return check_table(df, self.part, allow_empty=True)

    def start(self) -> None:
        """Every check passed: cut a kill's partial last line off, to append after it."""
        os.ftruncate(self.fd, self.whole)
        os.lseek(self.fd, self.whole, os.SEEK_SET)

    def write(self, text: str) -> None:
        """Append `text` in one flushed write (a kill leaves whole lines and at most one partial)."""
        data = text.encode("utf-8")
        while data:
            data = data[os.write(self.fd, data) :]
        os.fsync(self.fd)

    def replace(self, text: str) -> None:
        """The file's content replaced whole (atomically: a new file renamed over it), and
        the new file held in its place."""
        write_atomic(self.part, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        old, self.fd = self.fd, os.open(self.part, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        flock(self.fd, f"the sweep table {self.part}", wait_s=0)
        os.close(old)
        os.lseek(self.fd, 0, os.SEEK_END)

    def empty(self) -> bool:
        return os.fstat(self.fd).st_size == 0

    def finish(self) -> None:
        """The sweep's table is written: the part file goes, then its lock."""
        self.part.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            if self.created and self.empty():  # made by this run and never written: not left behind
                self.part.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = -1


class PartWriter:
    """Appends rows to a part file, one flushed write per row. The header comes with the
    first row (or the rows a resume starts from); each row must have its columns."""

    def __init__(self, held: PartFile, done: pd.DataFrame | None) -> None:
        self.held, self.columns, self.done = held, None, done
        if done is not None and not held.created:
            self.columns = list(done.columns)  # appending to the part file we recovered
            held.start()
        elif done is not None:  # resuming from a finished OUT: its rows start the part file
            self.columns = list(done.columns)
            self._write(done, header=True)

    def write(self, row: dict) -> None:
        import pandas as pd

        if self.columns is None:
            self.columns = list(row)
            self._write(pd.DataFrame([row]), header=True)
            return
        if list(row) != self.columns and set(self.columns) < set(row) and self.done is not None:
            self._widen(list(row))
        require(
            list(row) == self.columns,
            f"--resume: {self.held.part} has the columns of another pipesim version; write a new --out",
        )
        self._write(pd.DataFrame([row]), header=False)

    def _widen(self, columns: list[str]) -> None:
        """The rows done, written before `columns` had all their members, rewritten
        with them (the new ones empty) before the first new row is appended."""
        assert self.done is not None  # widened on resume only: the rows done were read
        self.held.replace(self.done.reindex(columns=columns).to_csv(index=False, lineterminator="\n"))
        self.columns = columns

    def _write(self, df: pd.DataFrame, header: bool) -> None:
        self.held.write(df.to_csv(index=False, header=header, lineterminator="\n"))

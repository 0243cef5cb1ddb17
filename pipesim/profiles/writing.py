"""Writing a profile: where it may go (`check_profile_out`), the whole folder at once
(`write_profile`), and a rewrite with some parts replaced (`rewrite_profile`), each under
the profile's lock (profile.profile_lock) and through writes.write_folder, so a reader
sees the old profile or the whole new one and two writers of one profile take turns."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ..base.errors import UserError, require
from ..base.writes import old_versions, write_folder
from .bounds import Datasheet, check_tables, datasheet
from .measured import read_points
from .profile import Profile, _profile_dir, check_meta, load_unlocked, profile_lock, profile_names
from .tables import TABLE_COLUMNS, read_columns

if TYPE_CHECKING:
    from importlib.abc import Traversable

    import pandas as pd


def check_profile_out(path: str | Path) -> Path:
    """Where a profile folder may be written: not a shipped profile's bare name (it would
    land in the current folder, unused), not a symbolic link (the link would be replaced
    by a folder), not an existing file, not a folder of other things (its files would be
    replaced). An empty folder or a profile folder is fine."""
    text = str(path)
    require(text.strip() != "", "--out is empty; give the folder to write the profile to")
    require(
        text not in profile_names() or Path(text).joinpath("profile.toml").is_file(),
        f"'{text}' is a shipped profile; write the new profile to a folder path instead, e.g. --out ./{text}-mine",
    )
    out = Path(path)
    if out.is_symlink():
        raise UserError(
            f"--out '{out}' is a symbolic link (to '{os.readlink(out)}'); pipesim would replace the link by a "
            "folder: give the folder it points to"
        )
    require(
        not out.exists() or out.is_dir(),
        f"--out '{out}' is a file, not a profile folder; give a new folder or an existing profile",
    )
    require(
        not out.is_dir() or (out / "profile.toml").is_file() or not any(out.iterdir()),
        f"--out '{out}' is a folder without profile.toml; pipesim replaces only a profile folder (or an empty one)",
    )
    return Path(os.path.abspath(text))


def write_profile(
    out_dir: str | Path,
    meta: dict,
    tables: dict[str, pd.DataFrame],
    measured: pd.DataFrame | None = None,
    extra: dict[str, str] | None = None,
) -> Path:
    """Write a profile directory so that a reader sees the old one or the whole new one
    (writes.write_folder: a new `.NAME.new-*` folder renamed into place, the old one
    aside and then removed; an error, Ctrl-C or SIGTERM leaves the old one), holding the
    profile's lock. `measured` becomes measured.csv; `extra` maps file names (a fit
    report, a log) to their text."""
    out = check_profile_out(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with profile_lock(out):
        _write_unlocked(out, meta, tables, measured, extra)
    return Path(out_dir)


def _write_unlocked(
    out: Path,
    meta: dict,
    tables: Mapping[str, pd.DataFrame],
    measured: pd.DataFrame | None,
    extra: dict[str, str] | None,
    copied: Mapping[str, Path] | None = None,
) -> None:
    """`copied`: tables of the profile being rewritten, kept as their files (loaded, so
    checked when they were read)."""
    import shutil

    from ..base.toml import dumps

    check_written(out, meta, tables, measured, extra)

    def fill(tmp: Path) -> None:
        for name, df in tables.items():
            # mtime=0 keeps rebuilt files byte-identical when their content is
            df.to_csv(tmp / f"{name}.csv.gz", index=False, compression={"method": "gzip", "mtime": 0})
        for name, src in (copied or {}).items():
            shutil.copy2(src, tmp / f"{name}.csv.gz")
        if measured is not None and len(measured):
            measured.to_csv(tmp / "measured.csv", index=False)
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        (tmp / "profile.toml").write_text(dumps(meta), encoding="utf-8")

    if not out.exists() and old_versions(out):  # a killed write's old version: put back, then replaced
        olds = [p for p in old_versions(out) if (p / "profile.toml").is_file()]
        if len(olds) == 1:
            os.rename(olds[0], out)
    write_folder(out, fill)


def check_written(
    out: Path,
    meta: dict,
    tables: Mapping[str, pd.DataFrame],
    measured: pd.DataFrame | None,
    extra: dict[str, str] | None,
) -> None:
    """Every part of a profile about to be written, read back through the reader that
    will load it, before anything is written: profile.toml's keys and parameters, each
    table's cells and its physics against the box it names (bounds.py: an import in the
    wrong unit is refused here, not written to fail at the next load), the measured points."""
    import io

    from ..base.checks import parse_toml
    from ..base.toml import dumps
    from ..inputs.box import box_from_dict

    where = f"the profile to be written to {out}"
    check_meta(parse_toml(dumps(meta), where), f"{where}: profile.toml")
    box = str(meta["box"])
    if box.endswith(".toml") and box in (extra or {}):  # a box file written beside it (calibrate live)
        text = (extra or {})[box]
        sheet: Datasheet | None = Datasheet.of(box_from_dict(parse_toml(text, box), box))
    else:
        sheet = datasheet(box if not box.endswith(".toml") or Path(box).is_absolute() else out / box)
    columns = {}
    for name, df in tables.items():
        require(name in TABLE_COLUMNS, f"unknown table {name}")
        text = df.to_csv(index=False)
        columns[name] = read_columns(io.StringIO(text), name, f"{where}: table {name}")
    check_tables(columns, lambda t: f"{where}: table {t}", sheet)
    if measured is not None and len(measured):
        read_points(
            io.StringIO(measured.to_csv(index=False)),
            f"{where}: measured.csv",
            str(meta.get("model", "kimi-k2.6")),
            str(meta["engine"]),
        )


KEPT_AS_IS = ("profile.toml", "measured.csv")  # rewritten from their parsed form


def profile_files(name_or_path: str | Path) -> dict[str, str]:
    """The text files of a profile besides its tables, profile.toml and measured.csv
    (reports, logs, a box.toml, live extras), to carry them over when it is rewritten."""
    return _files(_profile_dir(name_or_path))


def _files(folder: Path | Traversable) -> dict[str, str]:
    return {
        p.name: p.read_text()
        for p in folder.iterdir()
        if p.is_file()
        and not p.name.startswith(".")
        and not p.name.endswith(".csv.gz")
        and p.name not in KEPT_AS_IS
    }


class Edit(TypedDict, total=False):
    """What a rewrite replaces: tables by name, the measured points, keys of profile.toml,
    extra files."""

    tables: dict[str, pd.DataFrame]
    measured: pd.DataFrame
    meta_update: dict
    extra: dict[str, str]


def rewrite_profile(
    name_or_path: str | Path,
    out: str | Path | None = None,
    *,
    tables: dict | None = None,
    measured: pd.DataFrame | None = None,
    meta_update: dict | None = None,
    extra: dict | None = None,
    edit: Callable[[Profile], Edit] | None = None,
) -> Path:
    """Write a profile again, atomically, with some parts replaced (in place unless `out`).
    The profile is read and written under its lock, so two rewrites of one profile (two
    imports at once) each see the other's result: `edit(profile)` computes the parts
    from the profile as it is then (an import adding rows to a table)."""
    import pandas as pd

    from .measured import points_frame

    target = check_profile_out(name_or_path if out is None else out)
    source = _profile_dir(name_or_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        # the target's lock alone, the source's shared where it sits in another folder: taken
        # in one order, so two rewrites never wait on each other
        held = {target.parent: (target, False)}
        if isinstance(source, Path) and source.parent != target.parent:
            held[source.parent] = (source, True)
        for parent in sorted(held):
            stack.enter_context(profile_lock(held[parent][0], shared=held[parent][1]))
        prof = load_unlocked(source)
        changes: Edit = edit(prof) if edit is not None else {}
        new_tables = {**prof.tables, **(tables or {}), **changes.get("tables", {})}
        points = changes.get("measured", measured)
        if points is None:
            points = points_frame(list(prof.measured)) if prof.measured else pd.DataFrame()
        files = _files(source)
        replaced = {**(tables or {}), **changes.get("tables", {})}
        # the tables kept: copied as files, byte for byte with their times, not decoded and
        # encoded again (the parsed-table cache, keyed by path, size and time, still holds them)
        copied = {
            t: Path(str(source)) / f"{t}.csv.gz"
            for t in prof.tables
            if t not in replaced and isinstance(source, Path) and (source / f"{t}.csv.gz").is_file()
        }
        _write_unlocked(
            target,
            {**prof.meta, **(meta_update or {}), **changes.get("meta_update", {})},
            {t: df for t, df in new_tables.items() if t not in copied},
            points,
            {**files, **(extra or {}), **changes.get("extra", {})},
            copied,
        )
    return target

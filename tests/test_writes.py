"""Writes never harm a user's file (base/writes.py, docs/bad-input.md "Writes never lose
or move a user's file"): no write through or over a symbolic link, none over the
command's own inputs, nothing removed that the run did not create, temporaries cleaned
up on an error, Ctrl-C and SIGTERM, and a lock that lets two processes write one
profile or one sweep table in turn, or refuses the second, never mixing them.

The processes that race are made to meet at a stated point by reading a line from
their parent (no sleeps, no timing): a writer holds the lock and waits, the other says
it is about to ask for it, then the first goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipesim.base.errors import UserError
from pipesim.base.writes import check_target, input_paths, write_files
from pipesim.cli import main
from pipesim.profiles.profile import load_profile
from pipesim.profiles.writing import check_profile_out, write_profile

TESTS = Path(__file__).resolve().parent
DATA = TESTS / "data"
FAST = ["--model", "llama-3.1-8b", "--output-len", "4", "--input-len", "8", "--gpus", "8", "--splits", "8x1"]


def listing(folder: Path) -> dict[str, bytes | str]:
    """Every entry of a folder: a file's bytes, a link's target, a folder's listing."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else ("dir" if p.is_dir() else p.read_bytes())
    return out


def run_cli(argv, capsys) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code)
    return code, capsys.readouterr().err


def child(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS,
    )


def say(proc: subprocess.Popen, line: str = "go") -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def heard(proc: subprocess.Popen) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


# ---- the target check -----------------------------------------------------------------


def test_check_target_refuses_a_link_a_folder_and_an_input(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    (tmp_path / "link.json").symlink_to(tmp_path / "mine.txt")
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="is a symbolic link"):
        check_target(tmp_path / "link.json", "trace")
    with pytest.raises(UserError, match="is a folder"):
        check_target(tmp_path / "dir.json", "trace")
    inputs = input_paths(model=str(tmp_path / "config.json"), box="rtx-pro-6000-server-8x", profile=None)
    assert list(inputs) == ["model"]  # a preset name or None is not a file
    with pytest.raises(UserError, match="is this command's model input"):
        check_target(tmp_path / "config.json", "trace", inputs)
    assert check_target(tmp_path / "new.json", "trace", inputs) == tmp_path / "new.json"
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_write_files_is_all_or_none_and_leaves_no_temporary(tmp_path):
    (tmp_path / "a.txt").write_text("old a")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_files([(tmp_path / "a.txt", lambda t: t.write_text("new a")), (tmp_path / "b.txt", fail)])
    assert listing(tmp_path) == {"a.txt": b"old a"}
    write_files([(tmp_path / "a.txt", lambda t: t.write_text("new a")), (tmp_path / "b.txt", lambda t: 0)])
    assert listing(tmp_path) == {"a.txt": b"new a", "b.txt": b""}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    kinds=st.lists(st.sampled_from(["new", "file", "link", "folder"]), min_size=1, max_size=4),
    fail_at=st.integers(-1, 4),
    interrupt=st.booleans(),
)
def test_any_write_leaves_the_old_files_or_all_new_ones(kinds, fail_at, interrupt, tmp_path_factory):
    """Whatever the targets are (new, an existing file, a link to a user's file, a folder)
    and wherever the write fails (an error or Ctrl-C in the k-th file): a link or folder
    is refused before anything is written, else every target is old or all are new, the
    linked file is untouched and no temporary is left."""
    d = tmp_path_factory.mktemp("w")
    (d / "user.txt").write_text("user")
    targets = []
    for i, kind in enumerate(kinds):
        p = d / f"t{i}.txt"
        if kind == "file":
            p.write_text("old")
        elif kind == "link":
            p.symlink_to(d / "user.txt")
        elif kind == "folder":
            p.mkdir()
        targets.append(p)
    before = listing(d)

    def writer(i: int):
        def write(tmp: Path) -> None:
            tmp.write_text("new")
            if i == fail_at:
                raise KeyboardInterrupt if interrupt else OSError("disk full")

        return write

    try:
        for p in targets:
            check_target(p, "output")
        write_files([(p, writer(i)) for i, p in enumerate(targets)])
        wrote = True
    except (UserError, OSError, KeyboardInterrupt):
        wrote = False
    after = listing(d)
    assert after["user.txt"] == b"user"
    if wrote:
        assert {"link", "folder"}.isdisjoint(kinds) and not 0 <= fail_at < len(kinds)
        assert all(after[f"t{i}.txt"] == b"new" for i in range(len(kinds)))
    assert wrote or after == before
    assert set(after) == set(before) | {f"t{i}.txt" for i in range(len(kinds)) if wrote}


# ---- SIGTERM: the write's own temporaries go ----------------------------------------------

PLOT_CHILD = """
import sys
from matplotlib.figure import Figure
from pipesim.explore import plot
from test_plot import table
real, calls = Figure.savefig, []
def savefig(self, *a, **k):
    calls.append(1)
    if len(calls) == 2:
        print("saving", flush=True)
        sys.stdin.readline()
    return real(self, *a, **k)
Figure.savefig = savefig
plot.save_all(table(), {out!r})
"""

TRACE_CHILD = """
import json, sys
from pipesim.cli import main
real = json.dumps
def dumps(*a, **k):
    print("writing", flush=True)
    sys.stdin.readline()
    return real(*a, **k)
json.dumps = dumps
main(["trace", "--conc", "1", "--model", "llama-3.1-8b", "--input-len", "8", "--output-len", "4",
      "--tp", "8", "--out", {out!r}])
"""


def test_sigterm_while_plot_writes_leaves_nothing(tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    (out / "throughput.png").write_bytes(b"the user's old figure")
    before = listing(out)
    proc = child(PLOT_CHILD.format(out=str(out)))
    assert heard(proc) == "saving"  # the first figure is drawn to its temporary file
    proc.send_signal(signal.SIGTERM)
    proc.communicate()
    assert proc.returncode != 0
    assert listing(out) == before


def test_sigterm_while_trace_writes_leaves_nothing_and_says_so(tmp_path):
    out = tmp_path / "t.json"
    out.write_text("the user's old trace")
    proc = child(TRACE_CHILD.format(out=str(out)))
    assert heard(proc) == "writing"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "pipesim: terminated"
    assert listing(tmp_path) == {"t.json": b"the user's old trace"}


# ---- profiles: links, other people's folders, the lock ------------------------------------


def _profile(tmp_path: Path, name: str = "p", description: str = "old") -> Path:
    src = load_profile("rtx-pro-6000-sglang-healthy")
    out = tmp_path / name
    write_profile(out, {**src.meta, "description": description}, {"collectives": src.tables["collectives"]})
    return out


def test_profile_out_that_is_a_link_is_refused_and_kept(tmp_path):
    real = _profile(tmp_path)
    (tmp_path / "link").symlink_to(real)
    before = listing(tmp_path)
    with pytest.raises(UserError, match="is a symbolic link"):
        check_profile_out(tmp_path / "link")
    assert listing(tmp_path) == before


def test_reads_and_writes_never_touch_folders_they_did_not_make(tmp_path, capsys):
    p = _profile(tmp_path)
    for name in (".p.old", ".p.new-mine", ".p.old-2024"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("keep me")
    before = listing(tmp_path)
    assert run_cli(["profiles", "show", str(p)], capsys)[0] == 0
    load_profile(p)
    assert listing(tmp_path) == before
    src = load_profile(p)
    write_profile(p, {**src.meta, "description": "new"}, dict(src.tables))
    assert load_profile(p).meta["description"] == "new"
    assert all((tmp_path / n / "notes.txt").read_text() == "keep me" for n in (".p.old", ".p.new-mine"))


def test_a_profile_named_by_its_own_folder_loads(tmp_path, monkeypatch, capsys):
    p = _profile(tmp_path)
    monkeypatch.chdir(p)
    assert load_profile(".").meta["description"] == "old"
    code, err = run_cli(["profiles", "show", "."], capsys)
    assert code == 0, err
    code, err = run_cli(["profiles", "show", ""], capsys)
    assert code == 2 and "the profile is empty" in err


HOLD_CHILD = """
import sys
import pipesim.profiles.writing as w
real = w.write_folder
def write_folder(out, fill):
    print("holding", flush=True)  # the profile's lock is held
    sys.stdin.readline()
    return real(out, fill)
w.write_folder = write_folder
from pipesim.profiles.importers.nccl_tests import import_file
import_file({file!r}, {profile!r}, gpus={gpus})
print("done", flush=True)
"""
ASK_CHILD = """
import sys
import pipesim.base.writes as bw
real = bw.flock
def flock(fd, what, **k):
    print("asking", flush=True)  # about to ask for the lock the other holds
    return real(fd, what, **k)
bw.flock = flock
{body}
"""


def test_two_imports_into_one_profile_take_turns_and_both_land(tmp_path):
    p = _profile(tmp_path)
    data = str(DATA / "all_reduce_perf_8gpu.txt")
    first = child(HOLD_CHILD.format(file=data, profile=str(p), gpus=8))
    assert heard(first) == "holding"
    body = f"from pipesim.profiles.importers.nccl_tests import import_file\nimport_file({data!r}, {str(p)!r}, gpus=4)"
    second = child(ASK_CHILD.format(body=body))
    assert heard(second) == "asking"
    say(first)
    for proc in (first, second):
        _, err = proc.communicate()
        assert proc.returncode == 0, err
    table = load_profile(p).tables["collectives"]
    mine = table[(table.op == "all_reduce") & (table.impl == "nccl")]
    assert {4, 8} <= set(mine.gpus)  # each import's rows: neither lost the other's
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


RENAME_CHILD = """
import os, sys
from pipesim.profiles.profile import load_profile
from pipesim.profiles.writing import write_profile
src = load_profile({p!r})
real, calls = os.rename, []
def rename(a, b):
    calls.append(1)
    if len(calls) == 2:  # the old profile is aside, the new one not yet in place
        print("between", flush=True)
        sys.stdin.readline()
    return real(a, b)
os.rename = rename
write_profile({p!r}, {{**src.meta, "description": "new"}}, dict(src.tables))
"""


def test_a_reader_waits_for_a_writer_between_its_renames(tmp_path):
    p = _profile(tmp_path)
    writer = child(RENAME_CHILD.format(p=str(p)))
    assert heard(writer) == "between"
    assert not p.exists()  # the moment a reader without the lock would find nothing
    body = f"from pipesim.profiles.profile import load_profile\nprint(load_profile({str(p)!r}).meta['description'])"
    reader = child(ASK_CHILD.format(body=body))
    assert heard(reader) == "asking"
    say(writer)
    out, err = reader.communicate()
    writer.communicate()
    assert reader.returncode == 0 and writer.returncode == 0, err
    assert out.split()[-1] == "new"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_a_profile_write_waits_for_the_lock_then_says_who_holds_it(tmp_path, monkeypatch):
    import fcntl

    import pipesim.base.writes as bw

    p = _profile(tmp_path)
    src = load_profile(p)
    monkeypatch.setattr(bw, "LOCK_WAIT_S", 0.0)  # no wait: the test counts no seconds
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process's write, as flock sees it (another open)
    try:
        with pytest.raises(UserError, match="is being written by another pipesim process"):
            write_profile(p, {**src.meta, "description": "new"}, dict(src.tables))
        with pytest.raises(UserError, match="is being written by another pipesim process"):
            load_profile(p)
    finally:
        os.close(fd)
    assert load_profile(p).meta["description"] == "old"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


# ---- sweeps: the part file is the sweep's own -------------------------------------------------


def test_resume_through_a_linked_or_foreign_part_file_cuts_nothing(tmp_path, capsys):
    victim = tmp_path / "notes.txt"
    victim.write_text("line one\nline two, no newline")
    (tmp_path / "a.csv.part").symlink_to(victim)
    (tmp_path / "b.csv.part").write_text("x,y\n1,2\n3,")  # not a sweep's, a partial last line
    before = listing(tmp_path)
    for name, says in (("a.csv", "is a symbolic link"), ("b.csv", "is not a pipesim sweep table")):
        code, err = run_cli(
            ["sweep", "--conc", "1", *FAST, "--out", str(tmp_path / name), "--resume"], capsys
        )
        assert code == 2 and says in err, err
    assert listing(tmp_path) == before


def test_a_second_sweep_on_the_same_out_is_refused_while_the_first_runs(tmp_path, capsys):
    import fcntl

    out = tmp_path / "r.csv"
    part = tmp_path / "r.csv.part"
    part.write_text("")
    fd = os.open(part, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the first sweep, as flock sees it
    try:
        for resume in ([], ["--resume"]):
            code, err = run_cli(["sweep", "--conc", "1", *FAST, "--out", str(out), *resume], capsys)
            assert code == 2 and "is being written by another pipesim process" in err, err
    finally:
        os.close(fd)
    assert listing(tmp_path) == {"r.csv.part": b""}


def test_a_sweep_refused_after_its_checks_leaves_no_part_file(tmp_path, capsys):
    out = tmp_path / "r.csv"
    code, err = run_cli(["sweep", "--gpus", "16", *FAST[:6], "--conc", "1", "--out", str(out)], capsys)
    assert code == 2 and "GPUs, but the box has 8" in err
    assert listing(tmp_path) == {}


def test_a_sweep_writes_its_table_and_removes_its_part(tmp_path, capsys):
    out = tmp_path / "r.csv"
    code, err = run_cli(["sweep", "--conc", "1", *FAST, "--out", str(out), "--workers", "1"], capsys)
    assert code == 0, err
    assert sorted(os.listdir(tmp_path)) == ["r.csv"]


def test_trace_out_onto_its_own_model_config_is_refused(tmp_path, capsys):
    from test_hostile_input import TINY

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    before = listing(tmp_path)
    argv = ["trace", "--conc", "1", "--model", str(cfg), "--input-len", "8", "--output-len", "4"]
    code, err = run_cli([*argv, "--out", str(cfg)], capsys)
    assert code == 2 and "is this command's --model input" in err, err
    assert listing(tmp_path) == before


def test_the_table_cache_trims_only_its_own_copies(tmp_path, monkeypatch):
    from pipesim.profiles import tables

    monkeypatch.setenv("PIPESIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tables, "CACHE_MAX_FILES", 0)  # trim every copy the cache holds
    (tmp_path / "my-results.npz").write_bytes(b"a user's own numpy file")
    tables._trim_cache(tmp_path)
    assert (tmp_path / "my-results.npz").read_bytes() == b"a user's own numpy file"
    (tmp_path / f"gemm-{'0' * 24}.npz").write_bytes(b"a cached copy")
    tables._trim_cache(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["my-results.npz"]

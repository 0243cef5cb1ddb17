"""Profiles: malformed tables name the file, line and column; the shipped profiles
name the source of every table."""

from __future__ import annotations

import io

import pytest

from pipesim.base.errors import UserError
from pipesim.cli import main
from pipesim.profiles.profile import load_profile
from pipesim.profiles.tables import read_table

DEPLOYMENT = "rtx-pro-6000-sglang-deployment"


def cli_ok(args, capsys):
    main(args)  # no SystemExit on success
    return capsys.readouterr().out


# ---- profile tables ----------------------------------------------------------------


@pytest.mark.parametrize(
    "csv, msg",
    [
        ("dtype,m,n,k,latency_ms\nbf16,1,32,32,0.01\nbf16,2,32,32\n", "line 3, column latency_ms"),
        ("dtype,m,n,k\nbf16,1,32,32\n", "missing column"),
        ("dtype,m,n,k,latency_ms\nbf16,1,32,32,nan\n", "line 2, column latency_ms"),
        ("dtype,m,n,k,latency_ms\nbf16,1,32,32,-0.5\n", "latency > 0"),
        ("dtype,m,n,k,latency_ms\nbf16,0,32,32,0.5\n", "line 2, column m"),
        ("dtype,m,n,k,latency_ms\nbf16,1,32,32,0.5\nbf16,1,32,32,0.6\n", "line 3: sizes must not repeat"),
        ("dtype,m,n,k,latency_ms\nbf16,1,32,32,2e-6\nbf16,2,32,32,3e-6\n", "not seconds"),
        ("dtype,m,n,k,latency_ms\nbf16,1,32,32,2000\nbf16,2,32,32,3000\n", "not microseconds"),
    ],
)
def test_malformed_tables_name_file_line_column(csv, msg):
    with pytest.raises(UserError, match=msg):
        read_table(io.StringIO(csv), "gemm", "gemm.csv")


def test_shipped_profiles_and_their_provenance(capsys):
    out = cli_ok(["profiles", "list"], capsys)
    for name in (DEPLOYMENT, "rtx-pro-6000-sglang-healthy", "rtx-pro-6000-vllm"):
        assert name in out
        prof = load_profile(name)
        assert set(prof.sources) == set(prof.tables)  # every table names its source
    dep = load_profile(DEPLOYMENT)
    assert len(dep.measured) == 3 and dep.deployment["max_running_requests"] == 64
    healthy = load_profile("rtx-pro-6000-sglang-healthy")
    assert healthy.params.allreduce_scale == 1.0 and healthy.params.allreduce_offset_us == 0.0


def test_table_cache_keeps_the_most_recently_used(tmp_path, monkeypatch):
    """The parsed-table cache holds at most CACHE_MAX_FILES copies: a new one drops the
    least recently used, and reading a copy counts as a use."""
    import os
    import time

    from pipesim.profiles.tables import cached_columns

    cache = tmp_path / "cache"
    monkeypatch.setenv("PIPESIM_CACHE_DIR", str(cache))
    monkeypatch.setattr("pipesim.profiles.tables.CACHE_MIN_BYTES", 0)
    monkeypatch.setattr("pipesim.profiles.tables.CACHE_MAX_FILES", 2)
    header = b"dtype,hidden,inter,topk,experts,moe_tp,distribution,tokens,latency_ms\n"
    files = []
    for i in range(3):
        f = tmp_path / f"copy{i}" / "moe.csv"
        f.parent.mkdir()
        f.write_bytes(header + f"bf16,7168,2048,8,384,1,balanced,1,{0.05 + i}\n".encode())
        files.append(f)

    def copies() -> set:
        return set(cache.glob("*.npz"))

    cached_columns(files[0], "moe")
    first = copies()
    time.sleep(0.01)
    cached_columns(files[1], "moe")
    second = copies() - first
    os.utime(next(iter(second)), ns=(1, 1))  # copy 1 used long ago, copy 0 just now
    assert cached_columns(files[0], "moe")["latency_ms"].tolist() == [0.05]
    cached_columns(files[2], "moe")
    kept = copies()
    assert len(kept) == 2 and first <= kept and not (second & kept)


def test_tables_read_without_pandas_match_pandas(tmp_path, monkeypatch):
    """The csv-module reader (and its cached copy) gives what pandas reads from the same file."""
    import gzip as _gzip

    import pandas as pd

    from pipesim.profiles.tables import cached_columns

    monkeypatch.setenv("PIPESIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("pipesim.profiles.tables.CACHE_MIN_BYTES", 0)
    f = tmp_path / "moe.csv.gz"
    f.write_bytes(
        _gzip.compress(
            b"dtype,hidden,inter,topk,experts,moe_tp,distribution,tokens,latency_ms\n"
            b"bf16,7168,2048,8,384,1,balanced,1,0.05\nbf16,7168,2048,8,384,1,balanced,16,0.25\n"
        )
    )
    want = pd.read_csv(f)
    for _ in range(2):  # parsed, then from the cache
        got = cached_columns(f, "moe")
        assert list(got) == list(want.columns)
        for c in want.columns:
            assert list(got[c]) == list(want[c])
    assert len(list((tmp_path / "cache").glob("moe-*.npz"))) == 1


def test_predict_imports_no_pandas():
    import subprocess
    import sys

    code = (
        "import sys; from pipesim.cli import main; sys.argv = ['pipesim', 'predict', '--tp', '8', '--conc', '1', "
        "'--output-len', '8']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('pandas', 'pyarrow', 'matplotlib', 'scipy', 'dask') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_profile_toml_writes_non_ascii_text_as_itself(tmp_path):
    # a source line citing "physics.md §1" must read as written, not as a \u00a7 escape
    from pipesim.profiles.profile import load_profile
    from pipesim.profiles.writing import write_profile

    prof = load_profile("rtx-pro-6000-sglang-deployment")
    meta = dict(prof.meta, name="copy", description="fitted to physics.md §1's points")
    write_profile(tmp_path / "copy", meta, prof.tables)
    text = (tmp_path / "copy" / "profile.toml").read_text(encoding="utf-8")
    assert "physics.md §1's points" in text and "\\u00a7" not in text
    assert load_profile(tmp_path / "copy").meta["description"] == "fitted to physics.md §1's points"


def test_a_rewrite_that_changes_no_table_copies_the_tables_as_they_are(tmp_path):
    """Adding measured points (calibrate import bench) rewrites the profile without
    decoding and encoding its tables again: each table file is copied byte for byte with
    its time, so the parsed-table cache still holds it; a replaced table is written anew."""
    import shutil

    import pandas as pd

    from pipesim.profiles.profile import load_profile, profile_folder
    from pipesim.profiles.writing import rewrite_profile

    folder = tmp_path / "p"
    shutil.copytree(profile_folder("rtx-pro-6000-sglang-deployment"), folder, copy_function=shutil.copy2)
    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in folder.glob("*.csv.gz")}
    prof = load_profile(folder)
    rewrite_profile(folder, measured=pd.read_csv(folder / "measured.csv").head(2))
    after = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in folder.glob("*.csv.gz")}
    assert after == before
    again = load_profile(folder)
    assert len(again.measured) == 2 and set(again.tables) == set(prof.tables)
    gemm = prof.tables["gemm"].head(5)
    rewrite_profile(folder, tables={"gemm": gemm})
    assert (folder / "gemm.csv.gz").read_bytes() != before["gemm.csv.gz"][0]
    assert len(load_profile(folder).tables["gemm"]) == 5
    assert (folder / "moe.csv.gz").read_bytes() == before["moe.csv.gz"][0]


def test_a_tables_lookups_are_stored_once_and_read_back_until_its_file_changes(tmp_path, monkeypatch):
    """A profile's second load in another process reads its lookups back (no column read,
    no build) and gets the same curves; a rewritten table file is built again; a damaged
    stored lookup is built again, not trusted."""
    import os
    import shutil

    from pipesim.profiles import profile as P
    from pipesim.profiles import tables as T

    monkeypatch.setenv("PIPESIM_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "prof"
    shutil.copytree(P.profile_folder(DEPLOYMENT), folder)

    def fresh() -> T.Tables:
        P._load_profile.cache_clear()
        return P.load_profile(str(folder)).tables

    first = fresh()
    built = {k: first.collectives[k](1e6) for k in first.collectives}
    assert list((tmp_path / "cache").glob("lookup-collectives-*.pkl"))
    calls = []
    monkeypatch.setattr(T.Tables, "_collectives", lambda self: calls.append(1) or {})
    again = fresh()
    assert {k: again.collectives[k](1e6) for k in again.collectives} == built and calls == []
    assert not any(isinstance(v, dict) for v in again._columns.values())  # no column read either
    f = folder / "collectives.csv.gz"
    f.write_bytes(f.read_bytes())  # the same bytes, a new modification time: another key
    os.utime(f, ns=(1, 1))
    assert fresh().collectives == {} and calls == [1]
    for stored in (tmp_path / "cache").glob("lookup-collectives-*.pkl"):
        stored.write_bytes(b"damaged")
    assert fresh().collectives == {} and calls == [1, 1]

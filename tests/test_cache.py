"""Stored results (base/cache.py), scenario fingerprints (scenario/fingerprint.py) and
the process pool (base/pool.py): a hit returns what was stored, a changed scenario or
pipesim is a miss, parallel work gives the serial answer."""

from __future__ import annotations

import os
import pickle
from dataclasses import replace

import pytest
from conftest import SHORT_LLAMA as FAST

import pipesim
from pipesim.base import cache as C
from pipesim.base.pool import map_shared
from pipesim.scenario.build import build_scenario
from pipesim.scenario.fingerprint import fingerprint


def test_a_fingerprint_is_the_same_in_another_process_and_moves_with_any_value():
    import subprocess
    import sys

    sc = build_scenario(tp=2, pp=1, concurrency=4, **FAST)
    code = (
        "import pipesim; from pipesim.scenario.fingerprint import fingerprint; "
        "print(fingerprint(pipesim.build_scenario(tp=2, pp=1, concurrency=4, model='llama-3.1-8b', "
        "input_len='16', output_len='8')))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == fingerprint(sc)
    moved = [
        replace(sc, workload=replace(sc.workload, seed=1)),
        replace(sc, profile=sc.profile.with_params(frontend_ms=sc.profile.params.frontend_ms + 1e-9)),
        build_scenario(tp=2, pp=1, concurrency=4, max_running_requests=3, **FAST),
        build_scenario(tp=2, pp=1, concurrency=5, **FAST),
    ]
    assert len({fingerprint(sc), *map(fingerprint, moved)}) == 5


def test_one_latency_in_a_table_moves_the_fingerprint():
    from pipesim.profiles.tables import Tables

    sc = build_scenario(tp=2, pp=1, concurrency=4, **FAST)
    cols = {t: {c: a.copy() for c, a in sc.profile.tables.columns(t).items()} for t in sc.profile.tables}
    same = replace(sc, profile=replace(sc.profile, tables=Tables(columns=cols)))
    assert fingerprint(same) == fingerprint(sc)
    cols["gemm"]["latency_ms"][7] *= 1.001
    slower = replace(sc, profile=replace(sc.profile, tables=Tables(columns=cols)))
    assert fingerprint(slower) != fingerprint(sc)


def test_an_unknown_type_is_refused_not_fingerprinted_by_identity():
    with pytest.raises(TypeError, match="cannot fingerprint"):
        fingerprint({"x": object()})


def test_cache_hit_miss_and_version(tmp_path, monkeypatch):
    store = C.ResultCache(tmp_path)
    key = C.result_key("sensitivity", "abc")
    assert store.get(key) is None
    store.put(key, {"v": 1.5})
    assert store.get(key) == {"v": 1.5} and (store.hits, store.misses) == (1, 1)
    assert C.result_key("sensitivity", "abd") != key
    # another pipesim (a version, an edited source file) is another key
    monkeypatch.setattr(C, "code_version", lambda: "another")
    assert C.result_key("sensitivity", "abc") != key
    # a damaged file is a miss, a disabled cache finds and keeps nothing
    monkeypatch.undo()
    (tmp_path / f"{key}.pkl").write_bytes(b"not a pickle")
    assert store.get(key) is None
    off = C.ResultCache(tmp_path, enabled=False)
    off.put("k", 1)
    assert off.get("k") is None and not (tmp_path / "k.pkl").exists()


def test_an_edited_source_file_is_another_version(tmp_path, monkeypatch):
    import shutil

    pkg = tmp_path / "pipesim"
    shutil.copytree(
        os.path.dirname(pipesim.__file__), pkg, ignore=shutil.ignore_patterns("__pycache__", "data")
    )
    monkeypatch.setattr(C, "__file__", str(pkg / "base" / "cache.py"))
    C.code_version.cache_clear()
    try:
        before = C.code_version()
        (pkg / "api.py").write_text((pkg / "api.py").read_text() + "\n# edited\n")
        C.code_version.cache_clear()
        assert C.code_version() != before
    finally:
        monkeypatch.undo()
        C.code_version.cache_clear()


def test_the_cache_keeps_its_most_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "MAX_RESULTS", 3)
    store = C.ResultCache(tmp_path)
    for i in range(3):
        store.put(f"k{i}", i)
        os.utime(tmp_path / f"k{i}.pkl", ns=(i * 10**9, i * 10**9))
    store.get("k0")  # used now: the newest
    store.put("k3", 3)
    assert sorted(p.stem for p in tmp_path.glob("*.pkl")) == ["k0", "k2", "k3"]


def test_an_unwritable_folder_is_skipped(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    store = C.ResultCache(blocked / "results")
    store.put("k", 1)  # cannot make a folder under a file: nothing kept, no error
    assert store.get("k") is None


def _square_plus(shared: int, task: int) -> int:
    return task * task + shared


def test_the_pool_returns_the_serial_answer_in_order():
    done = []
    serial = map_shared(_square_plus, 7, range(9), jobs=1)
    parallel = map_shared(_square_plus, 7, range(9), jobs=2, on_done=done.append)
    assert parallel == serial == [i * i + 7 for i in range(9)]
    assert sorted(done) == list(range(9))


def test_stored_values_round_trip_as_pickles(tmp_path):
    r = pipesim.predict(1, 1, 2, ci_target=None, **FAST)
    store = C.ResultCache(tmp_path)
    store.put("r", r)
    back = store.get("r")
    assert pickle.dumps(back.to_dict()) == pickle.dumps(r.to_dict())

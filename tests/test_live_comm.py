"""Live calibration, collectives and P2P with one process per rank (gloo on the CPU)."""

import importlib.util
import time

import pytest

from pipesim.calibrate.live import comm, specs

TINY_GRIDS = specs.Grids(comm_bytes=(1024, 4096))


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_torch = pytest.mark.skipif(not has("torch"), reason="torch is not installed (pipesim[live])")
needs_transformers = pytest.mark.skipif(
    not (has("torch") and has("transformers")), reason="needs pipesim[live]"
)


@needs_torch
def test_collectives_and_p2p_with_gloo(tmp_path):
    records, note = comm.measure_comm(2, TINY_GRIDS, reps=2, warmup=1, limit_s=120, backend="gloo")
    assert note == "complete"
    keys = {(r.table,) + tuple(r.key) for r in records}
    for nbytes in (1024, 4096):
        assert ("collectives", "all_reduce", "gloo", 2, nbytes) in keys
        assert ("collectives", "all_gather", "gloo", 2, nbytes) in keys
        assert ("p2p", 0, 1, nbytes) in keys
    assert all(r.latency_ms > 0 for r in records)


@needs_torch
def test_a_peer_that_never_finishes_is_cut_at_the_limit(tmp_path):
    """Ranks that hang (here: a limit far too short for the run) are stopped within
    the limit; the call returns what was written and says why it stopped."""
    t = time.monotonic()
    records, note = comm.measure_comm(2, TINY_GRIDS, reps=2000, warmup=1, limit_s=1.0, backend="gloo")
    assert time.monotonic() - t < 30
    assert note.startswith("cut at the") or note.startswith("failed")
    assert all(r.latency_ms > 0 for r in records)

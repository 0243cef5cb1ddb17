"""Profiles: malformed tables name the file, line and column; the shipped profiles
name the source of every table."""

from __future__ import annotations

import io

import pytest

from pipesim.cli import main
from pipesim.errors import UserError
from pipesim.profile import load_profile, read_table

DEPLOYMENT = "rtx-pro-6000-sglang-deployment"


def cli_ok(args, capsys):
    main(args)  # no SystemExit on success
    return capsys.readouterr().out


# ---- profile tables ----------------------------------------------------------------

@pytest.mark.parametrize("csv, msg", [
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,0.01\nbf16,2,32,32\n", "line 3, column latency_ms"),
    ("dtype,m,n,k\nbf16,1,32,32\n", "missing column"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,nan\n", "line 2, column latency_ms"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,-0.5\n", "latency > 0"),
    ("dtype,m,n,k,latency_ms\nbf16,0,32,32,0.5\n", "line 2, column m"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,0.5\nbf16,1,32,32,0.6\n", "line 3: sizes must not repeat"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,2e-6\nbf16,2,32,32,3e-6\n", "not seconds"),
    ("dtype,m,n,k,latency_ms\nbf16,1,32,32,2000\nbf16,2,32,32,3000\n", "not microseconds"),
])
def test_malformed_tables_name_file_line_column(csv, msg):
    with pytest.raises(UserError, match=msg):
        read_table(io.StringIO(csv), "gemm", "gemm.csv")


def test_shipped_profiles_and_their_provenance(capsys):
    out = cli_ok(["profiles", "list"], capsys)
    for name in (DEPLOYMENT, "rtx-pro-6000-sglang-healthy", "rtx-pro-6000-vllm"):
        assert name in out
        prof = load_profile(name)
        assert set(prof.sources) == set(prof.tables)          # every table names its source
    dep = load_profile(DEPLOYMENT)
    assert len(dep.measured) == 3 and dep.deployment["max_running_requests"] == 64
    healthy = load_profile("rtx-pro-6000-sglang-healthy")
    assert healthy.params.allreduce_scale == 1.0 and healthy.params.allreduce_offset_us == 0.0

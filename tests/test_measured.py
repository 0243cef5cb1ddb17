"""Measured end-to-end points: the CSV checks and the band error."""

from __future__ import annotations

import io

import pytest

from pipesim.base.errors import UserError
from pipesim.profiles.measured import Point, read_points


@pytest.mark.parametrize(
    "csv, msg",
    [
        ("tp,pp,conc\n8,1,1\n", "missing column"),
        ("tp,pp,conc,tok_s\n8,1,x,26\n", "line 2, column conc"),
        ("tp,pp,conc,tok_s\n8,1,1,-3\n", "must be a finite number > 0"),
        ("tp,pp,conc,tok_s,tok_s_lo,tok_s_hi\n8,1,1,26,30,40\n", "tok_s_lo <= tok_s"),
        ("tp,pp,conc,tok_s,metric\n8,1,1,26,latency\n", "column metric"),
        ("tp,pp,conc,tok_s,color\n8,1,1,26,red\n", "unknown column"),
        ("tp,pp,conc,tok_s,disable_cuda_graph\n8,1,1,26,maybe\n", "true or false"),
    ],
)
def test_measured_csv_malformed(csv, msg):
    with pytest.raises(UserError, match=msg):
        read_points(io.StringIO(csv), "m.csv")


def test_band_error_is_zero_inside_and_relative_to_the_nearer_edge():
    p = Point("", "kimi-k2.6", "sglang", 8, 1, 32, 256, 300, "output_tok_s", 578, 808, (), "")
    assert p.error(700) == 0.0
    assert p.error(520.2) == pytest.approx((520.2 - 578) / 578)
    assert p.error(888.8) == pytest.approx((888.8 - 808) / 808)

"""Trace files in pipesim's columns or Vidur's (arrived_at, num_prefill_tokens,
num_decode_tokens: vidur/request_generator/trace_replay_request_generator.py) replay
the same requests; a Vidur file's bad cell is named by its own column."""

import pytest

from pipesim.base.errors import UserError
from pipesim.inputs.workload import from_trace

ROWS = [(0.0, 32, 16), (0.25, 48, 8), (0.1, 16, 24)]


def _write(path, header, rows, extra=""):
    lines = [header + extra] + [",".join(map(str, r)) + ("," + "x" if extra else "") for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_vidur_columns_replay_the_same_requests(tmp_path):
    ours = from_trace(_write(tmp_path / "a.csv", "arrival_s,input_tokens,output_tokens", ROWS))
    vidur = from_trace(
        _write(
            tmp_path / "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens", ROWS, extra=",request_type"
        )
    )
    assert vidur.trace == ours.trace == ((0.0, 32, 16), (0.1, 16, 24), (0.25, 48, 8))
    assert (vidur.input_len, vidur.output_len) == (ours.input_len, ours.output_len)


def test_a_vidur_trace_without_arrivals_or_with_a_bad_cell_is_one_line(tmp_path):
    no_arrivals = tmp_path / "n.csv"
    no_arrivals.write_text("num_prefill_tokens,num_decode_tokens\n32,16\n")
    with pytest.raises(UserError, match="missing Vidur column.*arrived_at"):
        from_trace(no_arrivals)
    bad = _write(tmp_path / "b.csv", "arrived_at,num_prefill_tokens,num_decode_tokens", [(0.0, 0, 16)])
    with pytest.raises(UserError, match="line 2, column num_prefill_tokens: '0' is not allowed"):
        from_trace(bad)

"""Files: the sweep table written and read back as .csv and .parquet, atomically (no
temporary file left), output paths checked before any work, bad input as one line."""

import sys

import pandas as pd
import pytest

import pipesim
from pipesim.base.files import TABLE_COLUMNS, check_out_path, read_table, write_table
from pipesim.base.writes import write_atomic
from pipesim.explore.grid import KEY_COLUMNS


def test_write_and_read_csv_and_parquet(serial, tmp_path):
    for name in ("r.csv", "r.parquet"):
        if name.endswith("parquet"):
            pytest.importorskip("pyarrow")
        write_table(serial, tmp_path / name)
        back = read_table(tmp_path / name)
        pd.testing.assert_frame_equal(back, serial, check_dtype=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.parquet"]  # no temporary files


def test_parquet_without_pyarrow_is_one_line(serial, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    with pytest.raises(pipesim.UserError, match="needs pyarrow"):
        write_table(serial, tmp_path / "r.parquet")
    assert not list(tmp_path.iterdir())


def test_a_table_read_back_needs_the_sweep_key(serial, tmp_path):
    # rate_rps and dp are the keys a table written before open-loop sweeps / data-parallel splits
    # lacks: read as 0 (closed loop) and 1; the text keys (box, engine, lengths) are needed by a
    # resume only (stream.py), not by search or plot
    numbers = set(KEY_COLUMNS) - {"box", "engine", "input_len", "output_len", "rate_rps", "dp"}
    assert numbers <= set(TABLE_COLUMNS) <= set(serial.columns) and set(KEY_COLUMNS) <= set(serial.columns)
    serial.drop(columns=["rate_rps", "dp"]).to_csv(tmp_path / "old.csv", index=False)
    old = read_table(tmp_path / "old.csv")
    assert (old.rate_rps == 0).all() and (old.dp == 1).all()
    serial.drop(columns=["conc"]).to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(pipesim.UserError, match="not a pipesim sweep table: no column.s. conc"):
        read_table(tmp_path / "r.csv")


@pytest.mark.parametrize(
    "name, needle",
    [("r.xlsx", "must end in .csv or .parquet"), ("no-such-dir/r.csv", "of the output file does not exist")],
)
def test_output_path_checked(tmp_path, name, needle):
    with pytest.raises(pipesim.UserError, match=needle):
        check_out_path(tmp_path / name, (".csv", ".parquet"), "output")


def test_failed_write_leaves_the_old_file(tmp_path):
    out = tmp_path / "f.txt"
    out.write_text("old")

    def half(tmp):
        tmp.write_text("ne")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(out, half)
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]

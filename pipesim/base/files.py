"""Files pipesim writes and reads back: output paths checked before any work, and the
sweep table as .csv or .parquet, written atomically (writes.py: a reader sees the old
file or the whole new one, never half).

pandas is imported inside the table functions only, so importing this module (as the
command line and the trace writer do) stays light.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checks import MAX_SWEEP_SCENARIOS, MAX_SWEEP_TABLE_BYTES, read_bounded
from .errors import UserError, require
from .jsonout import plain
from .writes import check_target, write_atomic

if TYPE_CHECKING:
    import pandas as pd

TABLE_SUFFIXES = (".csv", ".parquet")
# a sweep table read back needs its key (sweep.KEY_COLUMNS) and what search and plot rank by
TABLE_COLUMNS = ("gpus", "tp", "pp", "conc", "output_throughput_tok_s", "per_request_tok_s")
# headline numbers that carry a likely band `<col>_lo` / `<col>_hi` (uncertainty.HEADLINE)
INTERVAL_COLUMNS = (
    "output_throughput_tok_s",
    "per_request_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
)
# a figure that is not defined for some rows, written as an empty cell (docs/search.md §5):
# a run whose measured requests each produced one token has no decode, so no per-request
# decode speed (its TPOT columns, NUMBER_TABLE_COLUMNS, are empty too). Every reader takes
# the empty cell as "not defined"; inf or text is still refused.
UNDEFINED_OK = ("per_request_tok_s",)
# other number columns of a sweep table (sweep.run_point) that search and plot read; NaN is
# allowed there (a TPOT of one-token requests), text is not
NUMBER_TABLE_COLUMNS = (
    "seed",
    "dp",
    "output_throughput_ci_tok_s",
    "output_tok_s_per_gpu",
    "request_throughput_req_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "e2e_ms_mean",
    "compute_share",
    "allreduce_share",
    "bubble_fraction",
    "idle_p2p_share",
    "idle_cpu_share",
    "idle_bubble_share",
    "p2p_share",
    "cpu_share",
    "mean_requests_per_microbatch",
    "mean_decode_batch",
    "batches_in_flight",
    # the likely band of each headline number (uncertainty.HEADLINE; docs/uncertainty.md)
    *(f"{m}{end}" for m in INTERVAL_COLUMNS for end in ("_lo", "_hi")),
)


# text columns of a sweep table: read as text, so that a length '300' or a stage's '61'
# layers stay what the sweep wrote
TEXT_TABLE_COLUMNS = (
    "box",
    "gpu",
    "model",
    "profile",
    "engine",
    "input_len",
    "output_len",
    "split",
    "layers_per_stage",
    "decode_batch_per_slot",
    "occupancy_by_position",
    "empty_share_by_position",
    "cap_reason",
    "sweep_options",
)


def jsonable(v: object) -> object:
    """`v` as strict JSON holds it (jsonout.plain): a figure that is not defined (NaN) or
    not finite is null, numpy and pandas values plain numbers, lists and dicts, keys text."""
    return plain(v)


def json_text(v: object, **kwargs: Any) -> str:
    """Every JSON pipesim writes (--json outputs, traces): strict JSON (no NaN or
    Infinity, which most readers refuse), a figure that is not defined as null."""
    return json.dumps(jsonable(v), allow_nan=False, **kwargs)


def csv_kwargs() -> dict:
    """pandas.read_csv arguments for a sweep table: text columns as text, floats read back
    exactly as written (round trip: pandas 3's default, an option before)."""
    import pandas as pd

    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    return {"dtype": {c: str for c in TEXT_TABLE_COLUMNS}, **exact}


def check_out_path(
    path: str | Path, suffixes: tuple[str, ...], what: str, inputs: Mapping[str, Path] | None = None
) -> Path:
    """An output file, checked before any work: an allowed suffix, and what every write
    needs (writes.check_target: no symbolic link, an existing directory, none of the
    command's `inputs`)."""
    out = Path(path)
    require(out.suffix.lower() in suffixes, f"{what} file '{out}' must end in {' or '.join(suffixes)}")
    check_target(out, what, inputs)
    if out.suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise UserError(
                "writing Parquet needs pyarrow: pip install 'pipesim[parquet]', or write .csv"
            ) from None
    return out


def ensure_dir(path: str | Path, what: str) -> Path:
    """A folder to write into, made with its parents if missing; a file (or anything
    not a folder) where it or a parent should be is one line of error."""
    folder = Path(path)
    for p in [folder, *folder.parents]:
        require(
            not p.exists() or p.is_dir(),
            f"cannot make the {what} folder '{folder}': '{p}' is a file, not a folder",
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot make the {what} folder '{folder}': {exc.strerror or exc}") from None
    return folder


def write_table(df: pd.DataFrame, path: str | Path, inputs: Mapping[str, Path] | None = None) -> Path:
    """A sweep table as .csv or .parquet (by the file's suffix)."""
    out = check_out_path(path, TABLE_SUFFIXES, "output", inputs)
    if out.suffix.lower() == ".parquet":
        return write_atomic(out, lambda tmp: df.to_parquet(tmp, index=False))
    return write_atomic(out, lambda tmp: df.to_csv(tmp, index=False))


def read_table(path: str | Path) -> pd.DataFrame:
    """A sweep table written by `write_table` (or `pipesim sweep --out`)."""
    import pandas as pd

    p = Path(path)
    require(p.is_file(), f"sweep file '{p}' does not exist")
    if p.suffix.lower() == ".parquet":
        check_out_path(p, (".parquet",), "sweep")
        try:
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(p).metadata.num_rows  # from the footer, before any row is read
        except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
            raise UserError(f"sweep file '{p}': cannot read as Parquet ({type(exc).__name__})") from None
        require(
            rows <= MAX_SWEEP_SCENARIOS,
            f"sweep file '{p}': {rows:,} rows, above the limit of {MAX_SWEEP_SCENARIOS:,} (a sweep's scenarios)",
        )
        try:
            df = pd.read_parquet(p)
        except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
            raise UserError(f"sweep file '{p}': cannot read as Parquet ({type(exc).__name__})") from None
    else:
        require(p.suffix.lower() == ".csv", f"sweep file '{p}' must end in .csv or .parquet")
        data = read_bounded(p, f"sweep file '{p}'", MAX_SWEEP_TABLE_BYTES, MAX_SWEEP_SCENARIOS)
        try:
            # lengths are specs ("300" or "100:500"), as the sweep wrote them (csv_kwargs)
            df = pd.read_csv(io.BytesIO(data), **csv_kwargs())
        except Exception as exc:  # pandas raises many types for a malformed file
            raise UserError(f"sweep file '{p}': cannot read as CSV ({type(exc).__name__})") from None
    return check_table(df, p)


def check_table(df: pd.DataFrame, p: Path, allow_empty: bool = False) -> pd.DataFrame:
    """A sweep table read from `p`: its key and ranked columns present, every number cell a
    number (the ranked ones finite, or empty where not defined: UNDEFINED_OK); number
    columns made numeric."""
    import numpy as np
    import pandas as pd

    missing = [c for c in TABLE_COLUMNS if c not in df.columns]
    require(not missing, f"'{p}' is not a pipesim sweep table: no column(s) {', '.join(missing)}")
    if "rate_rps" not in df.columns:  # written before open-loop sweeps: every row a closed loop
        df["rate_rps"] = 0.0
    if "dp" not in df.columns:  # written before data-parallel splits: every row dp 1
        df["dp"] = 1
    require(allow_empty or len(df) > 0, f"sweep file '{p}' has no rows")
    for col in [c for c in df.columns if c in TABLE_COLUMNS or c in NUMBER_TABLE_COLUMNS]:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna() & df[col].notna()
        if col in TABLE_COLUMNS and not bad.any():
            bad = ~np.isfinite(values) & ~(values.isna() if col in UNDEFINED_OK else False)
            what = "is not a finite number"
        else:
            what = "is not a number"
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            cell = df[col].iloc[row]
            shown = repr(cell) if isinstance(cell, str) else str(cell)
            raise UserError(f"sweep file '{p}': line {row + 2}, column {col}: {shown} {what}")
        df[col] = values
    return df

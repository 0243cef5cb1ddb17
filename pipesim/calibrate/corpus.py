"""The public validation corpus: measured serving runs of vLLM and SGLang.

Each source (a benchmark page, a result repository, a pull request) is one CSV in the
repository's validation/ folder, installed as the package `pipesim.validation` so a
non-editable install finds it too. Rows are in long format: one measured number per row,
and the several metrics of one run share a `run_id`. validation/README.md documents the
columns and the sources.

The loader checks what a later comparison relies on (known metric names in their units,
positive finite values, whole-number parallel sizes, a citation for every number, one
configuration per run) and rejects the first bad row with one line naming the file and
its line, so a typo in a hand-gathered table cannot quietly become a validation point.
"""

from __future__ import annotations

import csv
import io
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from pipesim.base.errors import UserError, require

if TYPE_CHECKING:
    from importlib.abc import Traversable

#: Every column a corpus CSV must have, in the order they are written.
COLUMNS = (
    "row_id",
    "run_id",
    "source_id",
    "hardware",
    "gpus",
    "interconnect",
    "nodes",
    "engine",
    "engine_version",
    "model",
    "quantization",
    "kv_cache_dtype",
    "launch_flags",
    "workload",
    "num_prompts",
    "tp",
    "pp",
    "dp",
    "ep",
    "concurrency",
    "request_rate",
    "metric",
    "value",
    "unit",
    "citation",
    "notes",
)

#: Allowed metric names and the one unit each is recorded in. request_s is request
#: throughput; e2el is end-to-end request latency; p50 is the median.
METRICS = {
    "output_tok_s": "tok/s",
    "total_tok_s": "tok/s",
    "per_request_tok_s": "tok/s",
    "request_s": "req/s",
    **{
        f"{name}_ms_{stat}": "ms"
        for name in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "p50", "p90", "p99")
    },
}

ENGINES = ("vllm", "sglang")

#: Columns that describe the run, not the one number: rows of one run_id must agree on them.
RUN_COLUMNS = tuple(c for c in COLUMNS if c not in ("row_id", "metric", "value", "unit", "citation", "notes"))

_WHOLE = ("gpus", "nodes", "tp", "pp", "dp", "ep")  # required, >= 1
_OPTIONAL_WHOLE = ("num_prompts", "concurrency")  # empty or >= 1
_REQUIRED_TEXT = (
    "row_id",
    "run_id",
    "source_id",
    "hardware",
    "engine",
    "model",
    "workload",
    "metric",
    "unit",
    "citation",
)


def corpus_dir() -> Traversable | Path:
    """Where the shipped corpus is: the installed package `pipesim.validation`, or the
    repository's validation/ folder when pipesim runs uninstalled."""
    try:
        return resources.files("pipesim.validation")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "validation"


def _whole(text: str, where: str, column: str) -> int:
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number == int(number) and number >= 1):
        raise UserError(f"{where}, column {column}: {text!r} is not allowed (a whole number >= 1)")
    return int(number)


def _rate(text: str, where: str) -> float:
    if text.strip().lower() == "inf":
        return math.inf
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and rate > 0):
        raise UserError(
            f"{where}, column request_rate: {text!r} is not allowed (requests/s > 0, 'inf', or empty)"
        )
    return rate


def _check_row(row: dict, where: str, stem: str) -> dict:
    for column in _REQUIRED_TEXT:
        require(row[column].strip() != "", f"{where}, column {column}: must not be empty")
    require(
        row["source_id"] == stem,
        f"{where}, column source_id: {row['source_id']!r} must match the file name ({stem!r}): one CSV per source",
    )
    require(
        row["engine"] in ENGINES,
        f"{where}, column engine: {row['engine']!r} is not allowed (one of {', '.join(ENGINES)})",
    )
    metric = row["metric"]
    require(
        metric in METRICS, f"{where}, column metric: {metric!r} is not allowed (one of {', '.join(METRICS)})"
    )
    require(
        row["unit"] == METRICS[metric],
        f"{where}, column unit: {row['unit']!r} is not the unit of {metric} (it is {METRICS[metric]!r})",
    )
    try:
        value = float(row["value"])
    except ValueError:
        value = math.nan
    require(
        math.isfinite(value) and value > 0,
        f"{where}, column value: {row['value']!r} is not allowed (a finite number > 0)",
    )
    require(
        row["citation"].startswith(("https://", "http://")),
        f"{where}, column citation: {row['citation']!r} must start with the exact URL (https://...)",
    )
    out = dict(row, value=value)
    for column in _WHOLE:
        out[column] = _whole(row[column], where, column)
    for column in _OPTIONAL_WHOLE:
        out[column] = _whole(row[column], where, column) if row[column].strip() else None
    out["request_rate"] = _rate(row["request_rate"], where) if row["request_rate"].strip() else math.nan
    return out


def _load_text(text: str, origin: str, stem: str) -> list[dict]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in COLUMNS if c not in header]
    require(not missing, f"{origin}: missing column(s) {', '.join(missing)}; needed: {', '.join(COLUMNS)}")
    rows: list[dict] = []
    runs: dict[str, dict] = {}  # run_id -> its first row
    for row in reader:
        where = f"{origin}: line {reader.line_num}"
        require(
            None not in row and None not in row.values(),
            f"{where}: has {len(header) + len(row.get(None) or [])} fields, the header has {len(header)}"
            if None in row
            else f"{where}: has fewer fields than the header's {len(header)}",
        )
        checked = _check_row(row, where, stem)
        first = runs.setdefault(checked["run_id"], checked)
        for column in RUN_COLUMNS:
            same = first[column] == checked[column] or (
                column == "request_rate" and math.isnan(first[column]) and math.isnan(checked[column])
            )
            require(
                same,
                f"{where}, column {column}: run {checked['run_id']} already has {first[column]!r} here, "
                f"not {checked[column]!r} (one configuration per run_id)",
            )
        rows.append(checked)
    require(rows, f"{origin}: no data rows")
    return rows


def load_corpus(path: str | Path | None = None) -> pd.DataFrame:
    """Every CSV of the corpus folder (the shipped one by default) as one checked table.

    Raises `UserError` with one line naming the file and line of the first bad row.
    Parallel sizes and GPU counts come back as ints, num_prompts and concurrency as
    nullable ints, request_rate as float (inf: all requests at once; NaN: not stated).
    """
    folder = corpus_dir() if path is None else Path(path)
    require(folder.is_dir(), f"corpus folder not found: {folder}")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".csv")), key=lambda f: f.name)
    require(files, f"no corpus CSV files in {folder}")
    rows = []
    for f in files:
        rows += _load_text(f.read_text(encoding="utf-8"), str(f), f.name[: -len(".csv")])
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    dup = frame["row_id"].duplicated()
    if dup.any():
        raise UserError(
            f"row_id {frame['row_id'][dup].iloc[0]!r} appears twice in the corpus; row ids must be unique"
        )
    dup = frame.duplicated(["run_id", "metric"])
    if dup.any():
        first = frame[dup].iloc[0]
        raise UserError(
            f"run {first['run_id']!r} has metric {first['metric']!r} twice; one row per metric of a run"
        )
    for column in _OPTIONAL_WHOLE:
        frame[column] = frame[column].astype("Int64")
    return frame.astype({c: "int64" for c in _WHOLE} | {"value": "float64", "request_rate": "float64"})

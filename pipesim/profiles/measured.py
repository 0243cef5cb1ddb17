"""Measured end-to-end points: what a real deployment delivered, to fit and validate against.

A profile's `measured.csv` has one row per measured run:

    name, model, engine, tp, pp, conc, input_len, output_len,
    metric,                                             # output_tok_s (aggregate) or per_request_tok_s
    tok_s, tok_s_lo, tok_s_hi,                          # value, or a band [lo, hi]
    ttft_ms, tpot_ms,                                   # optional (blank)
    max_running_requests, pp_max_micro_batch_size,
    pp_async_batch_depth, disable_cuda_graph,           # engine flags of the run (blank: default)
    source

A band is what a user can honestly claim when runs disagree (e.g. 578-808 tok/s): a
prediction inside the band has no error; outside, the error is relative to the
nearer edge.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

from ..base.checks import (
    MAX_ASYNC_DEPTH,
    MAX_CONCURRENCY,
    MAX_CONFIG_SIZE,
    MAX_GPUS,
    MAX_MEASURED_POINTS,
    MAX_RUNNING,
    MAX_TEXT_BYTES,
    read_bounded,
)
from ..base.errors import UserError, require

if TYPE_CHECKING:  # read with the csv module: loading a profile needs no pandas
    from pathlib import Path
    from typing import IO

    import pandas as pd

COLUMNS = (
    "name",
    "model",
    "engine",
    "tp",
    "pp",
    "conc",
    "input_len",
    "output_len",
    "metric",
    "tok_s",
    "tok_s_lo",
    "tok_s_hi",
    "ttft_ms",
    "tpot_ms",
    "max_running_requests",
    "pp_max_micro_batch_size",
    "pp_async_batch_depth",
    "disable_cuda_graph",
    "source",
)
REQUIRED = ("tp", "pp", "conc", "tok_s")
# what a measured number is compared with: the aggregate output rate of the engine, or
# one request's decode speed ((output tokens - 1) / decode time, as single-request
# figures are usually quoted)
METRICS = ("output_tok_s", "per_request_tok_s")
KNOBS = ("max_running_requests", "pp_max_micro_batch_size", "pp_async_batch_depth", "disable_cuda_graph")
# the largest whole number each column may hold (checks.py's limits on a run; lengths: a model's context)
LIMITS = {
    "tp": MAX_GPUS,
    "pp": MAX_GPUS,
    "conc": MAX_CONCURRENCY,
    "max_running_requests": MAX_RUNNING,
    "pp_max_micro_batch_size": MAX_RUNNING,
    "pp_async_batch_depth": MAX_ASYNC_DEPTH,
}


@dataclass(frozen=True)
class Point:
    name: str
    model: str
    engine: str
    tp: int
    pp: int
    conc: int
    input_len: int
    output_len: int
    metric: str
    lo: float
    hi: float
    knobs: tuple  # ((knob, value), ...) given for this run
    source: str
    ttft_ms: float | None = None  # as measured, kept for reports (not fitted)
    tpot_ms: float | None = None

    @property
    def value(self) -> float:
        return (self.lo + self.hi) / 2

    def error(self, predicted: float) -> float:
        """Signed relative error: 0 inside the band, else against the nearer edge."""
        if predicted < self.lo:
            return (predicted - self.lo) / self.lo
        if predicted > self.hi:
            return (predicted - self.hi) / self.hi
        return 0.0

    def label(self) -> str:
        return self.name or f"TP{self.tp}xPP{self.pp} C={self.conc}"


def read_points(
    source: str | Path | IO, origin: str, default_model: str = "kimi-k2.6", default_engine: str = "sglang"
) -> list[Point]:
    """Read measured points; errors name the file, the line and the column."""
    try:
        if hasattr(source, "read"):
            text = source.read(MAX_TEXT_BYTES + 1)
            require(len(text) <= MAX_TEXT_BYTES, f"{origin}: more than {MAX_TEXT_BYTES / 2**20:,.0f} MiB")
        else:  # rows counted while it streams in (validate and fit run each point)
            text = read_bounded(source, origin, MAX_TEXT_BYTES, MAX_MEASURED_POINTS)
        if isinstance(text, bytes):
            text = text.decode()
        table = [r for r in csv.reader(text.splitlines()) if r]
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{origin}: cannot read as CSV ({type(exc).__name__})") from None
    require(len(table) > 0, f"{origin}: cannot read as CSV (EmptyDataError)")
    require(
        len(table) - 1 <= MAX_MEASURED_POINTS,
        f"{origin}: more than {MAX_MEASURED_POINTS:,} rows, above the limit of {MAX_MEASURED_POINTS:,}",
    )
    header = [h.strip() for h in table[0]]
    missing = [c for c in REQUIRED if c not in header]
    require(not missing, f"{origin}: missing column(s) {', '.join(missing)}; needed: {', '.join(REQUIRED)}")
    unknown = [c for c in header if c not in COLUMNS]
    require(not unknown, f"{origin}: unknown column(s) {', '.join(unknown)}; allowed: {', '.join(COLUMNS)}")
    points = []
    for i, cells in enumerate(table[1:]):
        line = i + 2
        require(
            len(cells) <= len(header),
            f"{origin}: cannot read as CSV (line {line} has {len(cells)} fields, the header {len(header)})",
        )
        row = dict(zip(header, cells))

        # an int for kind int, else a float; None only for a blank cell not required
        @overload
        def num(col: str, kind: type[int], required: Literal[True]) -> int: ...
        @overload
        def num(col: str, kind: type[int], required: Literal[False] = ...) -> int | None: ...
        @overload
        def num(col: str, kind: type[float], required: Literal[True]) -> float: ...
        @overload
        def num(col: str, kind: type[float], required: Literal[False] = ...) -> float | None: ...
        def num(
            col: str, kind: type, required: bool = False, row: dict[str, str] = row, line: int = line
        ) -> float | None:
            text = str(row.get(col, "")).strip()
            if text == "":
                require(not required, f"{origin}: line {line}, column {col}: a value is required")
                return None
            try:
                v = float(text)
            except ValueError:
                raise UserError(f"{origin}: line {line}, column {col}: '{text}' is not a number") from None
            require(
                math.isfinite(v) and (v > 0 or (col == "pp_async_batch_depth" and v == 0)),
                f"{origin}: line {line}, column {col}: {text} must be a finite number > 0",
            )
            if kind is int:
                hi = LIMITS.get(col, MAX_CONFIG_SIZE)
                require(
                    v == int(v) and v <= hi,
                    f"{origin}: line {line}, column {col}: {text} must be a whole number up to {hi}",
                )
                return int(v)
            return v

        value = num("tok_s", float, True)
        lo = num("tok_s_lo", float) or value
        hi = num("tok_s_hi", float) or value
        require(lo <= value <= hi, f"{origin}: line {line}: need tok_s_lo <= tok_s <= tok_s_hi")
        metric = str(row.get("metric", "")).strip() or "output_tok_s"
        require(
            metric in METRICS,
            f"{origin}: line {line}, column metric: '{metric}' is not one of {', '.join(METRICS)}",
        )
        out_len = num("output_len", int) or 300
        require(
            not (metric == "per_request_tok_s" and out_len == 1),
            f"{origin}: line {line}: a per-request decode speed at output_len 1 is not defined "
            "(a one-token output has no decode); give output_tok_s or a longer output",
        )
        knobs: list[tuple[str, bool | int]] = []
        for k in KNOBS:
            text = str(row.get(k, "")).strip()
            if text == "":
                continue
            if k == "disable_cuda_graph":
                require(
                    text.lower() in ("true", "false", "1", "0"),
                    f"{origin}: line {line}, column {k}: '{text}' must be true or false",
                )
                knobs.append((k, text.lower() in ("true", "1")))
            else:
                knobs.append((k, num(k, int, True)))  # not blank: a blank cell is skipped above
        points.append(
            Point(
                name=str(row.get("name", "")).strip(),
                model=str(row.get("model", "")).strip() or default_model,
                engine=str(row.get("engine", "")).strip() or default_engine,
                tp=num("tp", int, True),
                pp=num("pp", int, True),
                conc=num("conc", int, True),
                input_len=num("input_len", int) or 256,
                output_len=out_len,
                metric=metric,
                lo=lo,
                hi=hi,
                knobs=tuple(knobs),
                source=str(row.get("source", "")).strip(),
                ttft_ms=num("ttft_ms", float),
                tpot_ms=num("tpot_ms", float),
            )
        )
    return points


def points_frame(points: list[Point]) -> pd.DataFrame:
    """Points in measured.csv's layout (COLUMNS), to write back."""
    import pandas as pd

    rows = []
    for p in points:
        k = dict(p.knobs)
        rows.append(
            {
                "name": p.name,
                "model": p.model,
                "engine": p.engine,
                "tp": p.tp,
                "pp": p.pp,
                "conc": p.conc,
                "input_len": p.input_len,
                "output_len": p.output_len,
                "metric": p.metric,
                "tok_s": p.value,
                "tok_s_lo": p.lo,
                "tok_s_hi": p.hi,
                "ttft_ms": "" if p.ttft_ms is None else p.ttft_ms,
                "tpot_ms": "" if p.tpot_ms is None else p.tpot_ms,
                **{c: k.get(c, "") for c in KNOBS},
                "source": p.source,
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))

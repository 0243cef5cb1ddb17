"""What a search ranks by and keeps to: its objectives, its constraints, and how a
point's load, limits and uncertainty are written."""

from __future__ import annotations

from typing import Any, Protocol

# objective -> (column, larger is better, label)
OBJECTIVES = {
    "throughput": ("output_throughput_tok_s", True, "output tok/s"),
    "throughput-per-gpu": ("output_tok_s_per_gpu", True, "output tok/s per GPU"),
    "max-load": ("load", True, "the most load under the constraints"),
    "per-request": ("per_request_tok_s", True, "per-request tok/s"),
    "ttft": ("ttft_ms_p99", False, "TTFT p99 ms"),
    "fewest-gpus": ("gpus", False, "GPUs"),
}
# constraint -> (column, a point qualifies when column <= limit (True) or >= limit, text)
CONSTRAINTS = {
    "max_ttft_p50_ms": ("ttft_ms_p50", True, "TTFT p50 <= {:g} ms"),
    "max_ttft_p99_ms": ("ttft_ms_p99", True, "TTFT p99 <= {:g} ms"),
    "max_tpot_p50_ms": ("tpot_ms_p50", True, "TPOT p50 <= {:g} ms"),
    "max_tpot_p99_ms": ("tpot_ms_p99", True, "TPOT p99 <= {:g} ms"),
    "min_per_request_tok_s": ("per_request_tok_s", False, "per-request >= {:g} tok/s"),
}

COLUMN_NAMES = {
    "ttft_ms_p50": ("TTFT p50", "ms"),
    "ttft_ms_p99": ("TTFT p99", "ms"),
    "tpot_ms_p50": ("TPOT p50", "ms"),
    "tpot_ms_p99": ("TPOT p99", "ms"),
    "per_request_tok_s": ("per-request", "tok/s"),
}


class Row(Protocol):
    """A point of a sweep table as these read it: a table row (a pandas Series) or a
    dict of one (`to_dict("records")`); its cells are of the column's type."""

    def __getitem__(self, key: str, /) -> Any: ...

    def get(self, key: str, default: Any = None, /) -> Any: ...

    def __contains__(self, key: object, /) -> bool: ...


def speed_text(v: float | None) -> str:
    """A per-request speed as a table shows it: '-' where it is not defined (no measured
    request produced a second token; files.UNDEFINED_OK)."""
    return "-" if v is None or v != v else f"{v:,.1f}"


def load_text(r: Row, lc: str) -> str:
    return f"{r['rate_rps']:g} req/s" if lc == "rate_rps" else f"C={int(r['conc'])}"


def constraint_texts(constraints: dict[str, float], lc: str = "conc") -> list[str]:
    out = [CONSTRAINTS[k][2].format(v) for k, v in constraints.items()]
    if lc == "rate_rps":
        out.append("not overloaded (saturation.py)")
    return out


def _constraint_text(key: str, value: float) -> str:
    return CONSTRAINTS[key][2].format(value)


def interval_text(r: Row, col: str) -> str:
    """A point's uncertainty on `col`, where the table has one: a prediction interval
    (`<col>_lo` / `<col>_hi` columns) or, for throughput, the 95% CI half-width."""
    lo, hi = r.get(f"{col}_lo"), r.get(f"{col}_hi")
    if lo is not None and hi is not None and lo == lo and hi == hi:
        return f" (likely {lo:,.0f}-{hi:,.0f})" if hi >= 100 else f" (likely {lo:,.1f}-{hi:,.1f})"
    ci = r.get("output_throughput_ci_tok_s")
    if col == "output_throughput_tok_s" and ci is not None and ci == ci and round(ci, 1) > 0:
        return f" (+/- {ci:,.1f})"
    return ""


def noise(row: Row, objective: str) -> float:
    """The 95% half-width of a point's objective: throughput has one, latencies none."""
    if objective not in ("throughput", "throughput-per-gpu") or "output_throughput_ci_tok_s" not in row:
        return 0.0
    ci = row["output_throughput_ci_tok_s"]
    ci = 0.0 if ci != ci else float(ci)
    return ci / row["gpus"] if objective == "throughput-per-gpu" else ci

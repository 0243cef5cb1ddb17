"""A `Result` for people at a prompt and in a notebook: one short line (`str`, `repr`)
and a small HTML table (`_repr_html_`), each headline number beside its likely band.

The full report is report/table.py's (what `pipesim predict` prints); these only say
what a planner looks for first, so that a Result printed in a loop or shown in a cell
reads as an answer rather than a 5,000-character dataclass dump.
"""

from __future__ import annotations

import html as _html
import math
from typing import Any

# a metrics.Result (typed loosely: metrics.py imports this module, and an import back, even
# under TYPE_CHECKING, would be a cycle tests/test_structure.py refuses)
Result = Any

# (field, label, unit, format) of the headline numbers, in the table's order
ROWS = (
    ("output_throughput_tok_s", "output throughput", "tok/s", "{:,.1f}"),
    ("per_request_tok_s", "per-request decode", "tok/s", "{:,.1f}"),
    ("ttft_ms_p50", "TTFT p50", "ms", "{:,.1f}"),
    ("ttft_ms_p99", "TTFT p99", "ms", "{:,.1f}"),
    ("tpot_ms_p50", "TPOT p50", "ms", "{:,.1f}"),
    ("tpot_ms_p99", "TPOT p99", "ms", "{:,.1f}"),
)


def _fmt(v: float, spec: str = "{:,.1f}") -> str:
    return spec.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _band(r: Result, field: str) -> str:
    lo_hi = (r.intervals or {}).get(field)
    if not lo_hi or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in lo_hi):
        return ""
    spec = "{:,.1f}" if lo_hi[1] < 100 else "{:,.0f}"
    return f"{spec.format(lo_hi[0])}-{spec.format(lo_hi[1])}"


def what(r: Result) -> str:
    """'kimi-k2.6 on rtx-pro-6000-server-8x, sglang TP2 x PP4, C=64': the scenario in a phrase."""
    sc = r.scenario or {}
    w = sc.get("workload", {})
    load = (
        f"C={w.get('concurrency')}"
        if w.get("kind") == "closed"
        else f"{w.get('rate_rps')} req/s"
        if w.get("kind") == "poisson"
        else "trace"
    )
    dp = f" x DP{sc['dp']}" if sc.get("dp", 1) > 1 else ""
    ep = f" x EP{sc['ep']}" if sc.get("ep", 1) > 1 else ""
    engine = sc.get("engine", {}).get("engine", "?")
    return f"{sc.get('model', '?')} on {sc.get('box', '?')}, {engine} TP{sc.get('tp')} x PP{sc.get('pp')}{dp}{ep}, {load}"


def short(r: Result) -> str:
    """One line: the scenario, throughput with its band, per-request speed, TTFT and
    TPOT p50, and whether the headline is the corrected or the simulated figure."""
    band = _band(r, "output_throughput_tok_s")
    basis = r.interval_basis or {}
    corr = (basis.get("correction") or {}).get("throughput", 1.0)
    note = (
        f"; corrected x{corr:.3g} from the simulated {basis['uncorrected']['output_throughput_tok_s']:,.1f}"
        if corr != 1.0 and "uncorrected" in basis
        else ""
    )
    if not r.intervals:
        note = "; the simulation's own figures, no band (intervals=False)"
    return (
        f"{what(r)}: {_fmt(r.output_throughput_tok_s)} tok/s"
        + (f" (likely {band})" if band else "")
        + f", {_fmt(r.per_request_tok_s)} tok/s per request, TTFT p50 {_fmt(r.ttft_ms_p50, '{:,.0f}')} ms, "
        f"TPOT p50 {_fmt(r.tpot_ms_p50)} ms{note}"
    )


def html(r: Result) -> str:
    """The headline numbers as an HTML table, each with its likely band, headed by the
    scenario; a footnote for a corrected headline and for unchecked features."""
    esc = _html.escape
    rows = "".join(
        f"<tr><td style='text-align:left'>{esc(label)}</td><td>{_fmt(getattr(r, f), spec)}</td>"
        f"<td>{esc(_band(r, f)) or '-'}</td><td style='text-align:left'>{unit}</td></tr>"
        for f, label, unit, spec in ROWS
    )
    basis = r.interval_basis or {}
    notes = []
    if not r.intervals:
        notes.append("the simulation's own figures, no band (intervals=False)")
    else:
        notes.append(
            f"likely: a {basis.get('coverage', 0.8):.0%} band; calibration: {basis.get('calibration', '')}"
        )
        f = basis.get("correction") or {}
        if any(v != 1.0 for v in f.values()):
            notes.append(
                "corrected by the corpus residuals' median: "
                + ", ".join(f"{g} x{v:.3g}" for g, v in f.items())
                + f" (simulated {basis['uncorrected']['output_throughput_tok_s']:,.1f} tok/s)"
            )
        if basis.get("unchecked"):
            notes.append(
                "unchecked: "
                + ", ".join(u["feature"] for u in basis["unchecked"])
                + f" (+{basis.get('unchecked_rel', 0):.0%} each, in quadrature)"
            )
    foot = "".join(f"<br><small>{esc(n)}</small>" for n in notes)
    return (
        f"<div><b>{esc(what(r))}</b><table><thead><tr><th style='text-align:left'>metric</th><th>value</th>"
        f"<th>likely</th><th></th></tr></thead><tbody>{rows}</tbody></table>{foot}</div>"
    )

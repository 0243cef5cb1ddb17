"""Sensitivity: which calibrated parameters and workload assumptions move a prediction most.

A one-at-a-time tornado: each of the profile's numeric parameters (Params) and each
workload assumption is moved down and up by a relative step (default 20%) with
everything else, the seed included, held fixed (common random numbers), and every
headline number is re-predicted. The swing is high minus low of output throughput, in
% of the baseline. A parameter at zero cannot go down and 20% of zero is zero: it is
moved up only, by the fit's unit step for it (pipesim.profiles.profile.FITTABLE), stated
in the table. Each run is as long as a prediction's (the same stopping rule), so a
swing is what a prediction at the moved value would say; common random numbers keep
run-to-run noise out of it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from ..base.errors import require
from ..profiles.profile import FITTABLE, HOST_PARAMS
from ..scenario.work import Work

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..inputs.workload import Lengths, Workload
    from ..scenario.build import Scenario

METRICS = ("output_throughput_tok_s", "per_request_tok_s", "ttft_ms_p50", "tpot_ms_p50")
DEFAULT_STEP = 0.20
# Params that are settings, not costs: not perturbed
NOT_COSTS = ("moe_distribution", "custom_allreduce_max_gpus")
# The host loop's new terms move with `host_cpu_factor`, which scales them all (costs/host.py):
# the tornado steps the factor, the launch cost per kernel and the terms it stepped before
HOST_TOGETHER = tuple(
    p
    for p in HOST_PARAMS
    if p
    not in (
        "host_cpu_factor",
        "launch_us_per_kernel",
        "cpu_iteration_ms",
        "cpu_hop_ms",
        "frontend_ms",
        "detokenize_step_us",
        "detokenize_token_us",
    )
)
LENGTH_SPREAD = 0.5  # a fixed length N against uniform [N/2, 3N/2] (same mean)


def _num(v: float) -> str:
    return "-" if v != v else f"{v:,.1f}"


def _pct(v: float) -> str:
    return f"{'-':>7s}" if v != v else f"{v:+6.1f}%"


@dataclass(frozen=True)
class Item:
    """One bar of the tornado."""

    name: str
    kind: str  # "parameter" or "workload"
    low_label: str  # the value moved to, as text
    high_label: str
    low: dict | None  # metric -> value with the item moved down (None: not moved down)
    high: dict | None
    note: str = ""

    def swing(self, base: dict, metric: str = "output_throughput_tok_s") -> float:
        """(high - low) / baseline of a metric, in %: its share of the tornado."""
        lo = (self.low or base)[metric]
        hi = (self.high or base)[metric]
        return (hi - lo) / base[metric] * 100 if base[metric] else 0.0  # NaN: not defined


@dataclass(frozen=True)
class Sensitivity:
    base: dict
    step: float
    items: tuple  # sorted by |throughput swing|, largest first
    scenario: dict

    def table(self) -> str:
        b = self.base
        sc = self.scenario
        w = sc.get("workload", {})
        load = f"C={w.get('concurrency')}" if w.get("kind") == "closed" else f"{w.get('rate_rps')} req/s"
        lines = [
            (
                f"sensitivity: TP{sc['tp']} x PP{sc['pp']}, {load}, {sc['model']} on {sc['box']} ({sc['profile']}), "
                f"each item -+{self.step:.0%} alone, each run as long as a prediction's"
            ),
            (
                f"  baseline (simulated, not corrected): {b['output_throughput_tok_s']:,.1f} tok/s, "
                f"per-request {_num(b['per_request_tok_s'])} tok/s, "
                f"TTFT p50 {b['ttft_ms_p50']:,.1f} ms, TPOT p50 {_num(b['tpot_ms_p50'])} ms"
            ),
            (
                f"  {'item':28s} {'low -> high':>22s} {'throughput low/high':>22s} {'swing':>7s} "
                f"{'per-req':>7s} {'TTFT':>7s} {'TPOT':>7s}"
            ),
        ]
        for it in self.items:
            lo = "-" if it.low is None else f"{it.low['output_throughput_tok_s']:,.0f}"
            hi = "-" if it.high is None else f"{it.high['output_throughput_tok_s']:,.0f}"
            lines.append(
                f"  {it.name:28s} {it.low_label + ' -> ' + it.high_label:>22s} {lo + ' / ' + hi:>22s} "
                + " ".join(_pct(it.swing(b, m)) for m in METRICS)
            )
        lines.append(
            "  swing: (high - low) / baseline; '-' : not moved that way, or a figure not defined "
            "(per-request speed and TPOT when no request produced a second token)"
        )
        notes = [f"  {it.name}: {it.note}" for it in self.items if it.note]
        return "\n".join(lines + notes)

    def to_dict(self) -> dict:
        return {
            "base": self.base,
            "step": self.step,
            "scenario": self.scenario,
            "items": [
                {
                    "name": i.name,
                    "kind": i.kind,
                    "low_value": i.low_label,
                    "high_value": i.high_label,
                    "low": i.low,
                    "high": i.high,
                    "note": i.note,
                    "swing_pct": {m: i.swing(self.base, m) for m in METRICS},
                }
                for i in self.items
            ],
        }


def _metrics(scenario: Scenario) -> dict:
    """A perturbed scenario's headline figures from a run as long as a prediction's (the
    same stopping rule: its CI within 2%, or whole periods of a run that repeats). A
    short run's figures move with where its window falls in the run's cycle, which
    a swing would take for the item's effect (input length +20%: +13% over a short
    run against +2.6% over a prediction's)."""
    from ..sim.runner import run

    r = run(scenario)
    return {m: float(getattr(r, m)) for m in METRICS}


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _param_items(scenario: Scenario, step: float, measure: Callable[[Scenario], dict]) -> list[Item]:
    prof = scenario.profile
    items = []
    for f in fields(prof.params):
        if f.name in NOT_COSTS or f.name in HOST_TOGETHER:
            continue
        v = float(getattr(prof.params, f.name))
        if v == 0:
            unit = FITTABLE.get(f.name, (0, 0, 1.0))[2]
            hi = measure(replace(scenario, profile=prof.with_params(**{f.name: unit})))
            items.append(
                Item(
                    f.name,
                    "parameter",
                    "0",
                    _fmt(unit),
                    None,
                    hi,
                    f"at 0: moved up only, by its fit step {_fmt(unit)}",
                )
            )
            continue
        lo = measure(replace(scenario, profile=prof.with_params(**{f.name: v * (1 - step)})))
        hi = measure(replace(scenario, profile=prof.with_params(**{f.name: v * (1 + step)})))
        items.append(Item(f.name, "parameter", _fmt(v * (1 - step)), _fmt(v * (1 + step)), lo, hi))
    return items


def _scaled(lengths: Lengths, f: float) -> Lengths:
    from ..inputs.workload import Lengths

    return Lengths(max(1, round(lengths.lo * f)), max(1, round(lengths.hi * f)))


def _with_lengths(w: Workload, name: str, lengths: Lengths) -> Workload:
    """The workload with its input_len or output_len (`name`) replaced."""
    return replace(w, input_len=lengths) if name == "input_len" else replace(w, output_len=lengths)


def _workload_items(scenario: Scenario, step: float, measure: Callable[[Scenario], dict]) -> list[Item]:
    from ..inputs.workload import Lengths

    w = scenario.workload
    if w.kind == "trace":
        return []  # a trace pins lengths and arrivals
    items = []
    for name in ("input_len", "output_len"):
        cur = getattr(w, name)
        lo, hi = _scaled(cur, 1 - step), _scaled(cur, 1 + step)
        items.append(
            Item(
                name,
                "workload",
                str(lo),
                str(hi),
                measure(replace(scenario, workload=_with_lengths(w, name, lo))),
                measure(replace(scenario, workload=_with_lengths(w, name, hi))),
            )
        )
        if cur.lo == cur.hi:
            n = cur.lo
            spread = Lengths(max(1, round(n * (1 - LENGTH_SPREAD))), max(1, round(n * (1 + LENGTH_SPREAD))))
            items.append(
                Item(
                    f"{name} spread",
                    "workload",
                    str(cur),
                    str(spread),
                    None,
                    measure(replace(scenario, workload=_with_lengths(w, name, spread))),
                    f"fixed {n} against uniform {spread} (same mean)",
                )
            )
    if w.kind == "poisson":
        items.append(
            Item(
                "rate_rps",
                "workload",
                _fmt(w.rate_rps * (1 - step)),
                _fmt(w.rate_rps * (1 + step)),
                measure(replace(scenario, workload=replace(w, rate_rps=w.rate_rps * (1 - step)))),
                measure(replace(scenario, workload=replace(w, rate_rps=w.rate_rps * (1 + step)))),
            )
        )
    return items


def sensitivity(scenario: Scenario, step: float = DEFAULT_STEP) -> Sensitivity:
    """The tornado of a built scenario (about 2 runs per item, each as long as a
    prediction's)."""
    require(0 < step < 1, f"sensitivity step must be between 0 and 1 (a fraction, e.g. 0.2), got {step}")
    # every run it will make, counted before the first (scenario/work.py)
    planned: list[Scenario] = []

    def plan(sc: Scenario) -> dict:
        planned.append(sc)
        return dict.fromkeys(METRICS, 1.0)

    _param_items(scenario, step, plan), _workload_items(scenario, step, plan)
    work = Work("this sensitivity", "give it a shorter scenario (fewer requests or shorter outputs)")
    work.add("the base run", scenario).add("a run per item and side", planned).check()
    base = _metrics(scenario)
    items = _param_items(scenario, step, _metrics) + _workload_items(scenario, step, _metrics)
    items.sort(key=lambda i: -abs(i.swing(base)))
    return Sensitivity(base, step, tuple(items), scenario.describe())


NEGLIGIBLE_PCT = 0.1  # a swing below this (in % of the baseline) is listed, not drawn


def _engine_name(sc: dict) -> str:
    engine = sc.get("engine")
    name = engine.get("engine") if isinstance(engine, dict) else engine
    return {"sglang": "SGLang", "vllm": "vLLM"}.get(str(name), str(name))


def plot(sens: Sensitivity, path: str) -> None:
    """The tornado as a figure: each item's throughput change moved low (upper bar of its
    pair) and high (lower bar), in % of the simulated baseline, each bar labelled with
    its change; items that move it by less than NEGLIGIBLE_PCT are named in a note
    instead of drawn as empty rows. The title names the model, box, split, load and
    lengths, so a figure read on its own says what it is of."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = sens.base["output_throughput_tok_s"]
    drawn = [
        i
        for i in sens.items
        if abs(i.swing(sens.base)) >= NEGLIGIBLE_PCT or _largest(i, base) >= NEGLIGIBLE_PCT
    ]
    flat = [i.name for i in sens.items if i not in drawn]
    items = list(reversed(drawn))
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(items) + 2.4), dpi=110)
    for y, it in enumerate(items):
        for side, color, dy, label in (
            (it.low, "#4C72B0", 0.18, "moved low"),
            (it.high, "#C44E52", -0.18, "moved high"),
        ):
            if side is None:
                continue
            change = (side["output_throughput_tok_s"] - base) / base * 100
            ax.barh(
                y + dy,
                change,
                color=color,
                height=0.34,
                label=label if y == 0 or not ax.get_legend_handles_labels()[1].count(label) else None,
            )
            ax.annotate(
                f"{change:+.1f}%",
                (change, y + dy),
                textcoords="offset points",
                xytext=(4 if change >= 0 else -4, 0),
                ha="left" if change >= 0 else "right",
                va="center",
                fontsize=8,
            )
    ax.set_yticks(range(len(items)), [f"{i.name}\n{i.low_label} / {i.high_label}" for i in items], fontsize=9)
    ax.axvline(0, color="black", lw=0.8)
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo - 0.12 * (hi - lo), hi + 0.12 * (hi - lo))  # room for the labels
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_xlabel(f"output throughput change, % of the simulated {base:,.0f} tok/s")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax.legend(seen.values(), seen.keys(), loc="lower right", fontsize=8)
    sc = sens.scenario
    w = sc.get("workload", {})
    load = f"C={w.get('concurrency')}" if w.get("kind") == "closed" else f"{w.get('rate_rps')} req/s"
    ax.set_title(
        f"What moves the answer: each item -/+{sens.step:.0%} alone, runs as long as a prediction's\n"
        f"{sc['model']} with {_engine_name(sc)} on {sc['box']}, TP{sc['tp']} x PP{sc['pp']}, {load}, in/out "
        f"{w.get('input_len', '-')}/{w.get('output_len', '-')} tokens\nprofile {sc['profile']}",
        fontsize=10,
    )
    if flat:
        fig.text(
            0.01,
            0.005,
            f"moves throughput by less than {NEGLIGIBLE_PCT:g}% either way: " + ", ".join(flat),
            fontsize=7.5,
            color="dimgrey",
            wrap=True,
        )
    fig.tight_layout(rect=(0, 0.04 if flat else 0, 1, 1))
    from ..base.writes import write_atomic

    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp))
    finally:
        plt.close(fig)


def _largest(item: Item, base: float) -> float:
    """The largest change of throughput either side of an item moves it, in % of `base`."""
    return max(
        (abs(side["output_throughput_tok_s"] - base) / base * 100 for side in (item.low, item.high) if side),
        default=0.0,
    )

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

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from ..base.errors import require
from ..profiles.profile import FITTABLE, HOST_PARAMS

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..base.cache import ResultCache
    from ..inputs.workload import Lengths
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


# A run of the tornado: what it changes in the base scenario, as ("params", {name: value})
# or ("workload", {field: value}); None is the base itself. Small, so that a worker
# process (base/pool.py) rebuilds the run from the base it holds.
Change = tuple[str, dict] | None


@dataclass(frozen=True)
class Bar:
    """One bar before it is run: what it changes either way."""

    name: str
    kind: str
    low_label: str
    high_label: str
    low: Change  # None: not moved down
    high: Change
    note: str = ""


def changed(base: Scenario, change: Change) -> Scenario:
    """The base scenario with one change applied (everything else, the seed included, kept)."""
    if change is None:
        return base
    what, values = change
    if what == "params":
        return replace(base, profile=base.profile.with_params(**values))
    return replace(base, workload=replace(base.workload, **values))


def _metrics(base: Scenario, change: Change) -> dict:
    """One run's headline figures (a worker's task: module-level), from a run as long as
    a prediction's (the same stopping rule: its CI within 2%, or whole periods of a run
    that repeats). A short run's figures move with where its window falls in the run's
    cycle, which a swing would take for the item's effect (input length +20%: +13% over
    a short run against +2.6% over a prediction's)."""
    from ..sim.runner import run

    r = run(changed(base, change))
    return {m: float(getattr(r, m)) for m in METRICS}


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _param_bars(scenario: Scenario, step: float) -> list[Bar]:
    prof = scenario.profile
    bars = []
    for f in fields(prof.params):
        if f.name in NOT_COSTS or f.name in HOST_TOGETHER:
            continue
        v = float(getattr(prof.params, f.name))
        if v == 0:
            unit = FITTABLE.get(f.name, (0, 0, 1.0))[2]
            note = f"at 0: moved up only, by its fit step {_fmt(unit)}"
            bars.append(Bar(f.name, "parameter", "0", _fmt(unit), None, ("params", {f.name: unit}), note))
            continue
        lo, hi = v * (1 - step), v * (1 + step)
        bars.append(
            Bar(f.name, "parameter", _fmt(lo), _fmt(hi), ("params", {f.name: lo}), ("params", {f.name: hi}))
        )
    return bars


def _scaled(lengths: Lengths, f: float) -> Lengths:
    from ..inputs.workload import Lengths

    return Lengths(max(1, round(lengths.lo * f)), max(1, round(lengths.hi * f)))


def _workload_bars(scenario: Scenario, step: float) -> list[Bar]:
    from ..inputs.workload import Lengths

    w = scenario.workload
    if w.kind == "trace":
        return []  # a trace pins lengths and arrivals
    bars = []
    for name in ("input_len", "output_len"):
        cur = getattr(w, name)
        lo, hi = _scaled(cur, 1 - step), _scaled(cur, 1 + step)
        bars.append(
            Bar(name, "workload", str(lo), str(hi), ("workload", {name: lo}), ("workload", {name: hi}))
        )
        if cur.lo == cur.hi:
            n = cur.lo
            spread = Lengths(max(1, round(n * (1 - LENGTH_SPREAD))), max(1, round(n * (1 + LENGTH_SPREAD))))
            note = f"fixed {n} against uniform {spread} (same mean)"
            bars.append(
                Bar(
                    f"{name} spread",
                    "workload",
                    str(cur),
                    str(spread),
                    None,
                    ("workload", {name: spread}),
                    note,
                )
            )
    if w.kind == "poisson":
        rate_lo, rate_hi = w.rate_rps * (1 - step), w.rate_rps * (1 + step)
        bars.append(
            Bar(
                "rate_rps",
                "workload",
                _fmt(rate_lo),
                _fmt(rate_hi),
                ("workload", {"rate_rps": rate_lo}),
                ("workload", {"rate_rps": rate_hi}),
            )
        )
    return bars


def runs(scenario: Scenario, step: float = DEFAULT_STEP) -> list[Change]:
    """Every run of a tornado of `scenario`, the base first, then each bar's low (if
    moved down) and high."""
    bars = _param_bars(scenario, step) + _workload_bars(scenario, step)
    return [None] + [c for b in bars for c in (b.low, b.high) if c is not None]


def _run_all(
    scenario: Scenario,
    changes: list[Change],
    jobs: int,
    cache: ResultCache | None,
    on_run: Callable[[], object] | None,
) -> list[dict]:
    """The figures of every run: found in `cache`, else simulated on `jobs` processes
    (each run to simulate counted in the work bound before the first starts) and stored."""
    from ..base.cache import result_key
    from ..base.pool import map_shared
    from ..scenario.fingerprint import fingerprint
    from ..scenario.work import Work

    keys = [result_key("sensitivity", fingerprint(changed(scenario, c))) for c in changes]
    stored = [cache.get(k) if cache is not None else None for k in keys]
    found: list[dict | None] = [v if isinstance(v, dict) else None for v in stored]  # as _metrics gave
    todo = [i for i, v in enumerate(found) if v is None]
    work = Work("this sensitivity", "give it a shorter scenario (fewer requests or shorter outputs)")
    work.add(
        f"the tornado's runs ({len(changes) - len(todo)} more found stored)",
        [changed(scenario, changes[i]) for i in todo],
    )
    work.check()
    for _ in range(len(changes) - len(todo)):
        if on_run:
            on_run()
    done = (lambda _: on_run()) if on_run else None
    for i, value in zip(todo, map_shared(_metrics, scenario, [changes[i] for i in todo], jobs, done)):
        found[i] = value
        if cache is not None:
            cache.put(keys[i], value)
    return [v for v in found if v is not None]


def sensitivity(
    scenario: Scenario,
    step: float = DEFAULT_STEP,
    *,
    jobs: int = 1,
    cache: ResultCache | None = None,
    on_run: Callable[[], object] | None = None,
) -> Sensitivity:
    """The tornado of a built scenario: the base and about 2 runs per item, each as long
    as a prediction's
    (`runs`), on `jobs` local processes (base/pool.py: the same numbers as one), each
    looked up in `cache` first (a run whose scenario and pipesim did not change is not
    simulated again, base/cache.py). The runs to simulate are counted in the work bound
    before the first starts (base/checks.py). `on_run()` after each run (progress)."""
    require(0 < step < 1, f"sensitivity step must be between 0 and 1 (a fraction, e.g. 0.2), got {step}")
    bars = _param_bars(scenario, step) + _workload_bars(scenario, step)
    base, *rest = _run_all(scenario, runs(scenario, step), jobs, cache, on_run)
    figures = iter(rest)
    items = []
    for b in bars:
        low = None if b.low is None else next(figures)
        items.append(Item(b.name, b.kind, b.low_label, b.high_label, low, next(figures), b.note))
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

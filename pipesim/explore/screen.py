"""A search's first stage: every plan of a plan space priced by the steady-state model
(scenario/steady_model.py), and the plans worth simulating chosen by its bands.

The plan space is boxes x engines x input lengths x output lengths x splits (tp x pp,
data-parallel ranks) x expert parallel (off, on) x running caps x prefill chunks x
loads. What does not change between plans is built once and shared: one Scenario per
(box, engine, lengths, split, expert parallel, chunk) (the chunk moves SGLang's memory
share, so the KV cache), its profile resolved once per box and engine, one CostModel
per (box, engine, split, expert parallel) with its cache of stage times; a running cap
re-resolves the engine's settings from that scenario (with the engine's rule for the
knobs it derives from the cap), a load is a workload of its own. The plans of one box,
engine and lengths are one task, on local processes (explore/workers.py).

A plan's band is the model's bracket widened by its measured error against the
simulation (the 90th percentile |error| of calibration/validate_steady_model.py, in
pipesim/data/steady_model_error.json); outside the model's domain only what the
physics caps. `select` keeps the plans whose band reaches the best sure value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from ..base.checks import MAX_SIMULATE
from ..base.errors import UserError, require
from ..scenario.build import build_scenario
from ..scenario.steady_model import steady_state
from ..scenario.whatif import KNOBS as WHATIF_KNOBS
from .grid import dp_splits_of, split_name
from .objectives import CONSTRAINTS, OBJECTIVES

if TYPE_CHECKING:
    import pandas as pd

    from ..engines.protocol import EngineConfig, EngineSettings
    from ..inputs.workload import Workload
    from ..scenario.build import Scenario
    from ..scenario.steady_model import Estimate

# model figure -> the sweep column a search reads (a constraint's or an objective's)
MODEL_COLUMNS = {
    "output_throughput_tok_s": "output_throughput_tok_s",
    "per_request_tok_s": "per_request_tok_s",
    "ttft_ms": "ttft_ms_p99",
    "tpot_ms": "tpot_ms_p99",
}
# what a constraint on a percentile is screened by: the model's typical figure
SCREENED = {
    "ttft_ms_p50": "ttft_ms",
    "ttft_ms_p99": "ttft_ms",
    "tpot_ms_p50": "tpot_ms",
    "tpot_ms_p99": "tpot_ms",
}


@cache
def model_error() -> dict[str, float]:
    """The model's 90th percentile |relative error| per figure, measured against the
    simulation (calibration/validate_steady_model.py writes it)."""
    text = resources.files("pipesim.data").joinpath("steady_model_error.json").read_text()
    return dict(json.loads(text)["p90_abs_error"])


@dataclass(frozen=True)
class PlanSpace:
    """The lists a two-stage search takes the product of (None: the default, one value)."""

    gpus: tuple[int, ...]
    loads: tuple[float, ...]
    open_loop: bool
    splits: tuple[tuple[int, int], ...] | None = None
    dps: tuple[int, ...] = (1,)
    expert_parallel: tuple[bool, ...] = (False,)
    running_caps: tuple[int | None, ...] = (None,)
    chunks: tuple[int | None, ...] = (None,)
    boxes: tuple = (None,)
    engines: tuple = (None,)
    input_lens: tuple = (None,)
    output_lens: tuple = (None,)

    @property
    def size(self) -> int:
        """Plans in the space before any is built (a split may not fit its box)."""
        attn = False
        splits = sum(
            1
            for g in self.gpus
            for dp in self.dps
            for s in dp_splits_of(g, dp, attn)
            if self.splits is None or s[:2] in self.splits
        )
        return (
            splits
            * len(self.expert_parallel)
            * len(self.running_caps)
            * len(self.chunks)
            * len(self.loads)
            * len(self.boxes)
            * len(self.engines)
            * len(self.input_lens)
            * len(self.output_lens)
        )

    def combos(self) -> list[dict]:
        """One task per box, engine and lengths (the values given; None: the default)."""
        return [
            dict(box=b, engine=e, input_len=i, output_len=o)
            for b in self.boxes
            for e in self.engines
            for i in self.input_lens
            for o in self.output_lens
        ]


def screen_combo(space: PlanSpace, kwargs: dict, combo: dict) -> dict:
    """Every plan of one box, engine and lengths, priced by the model: columns of a
    table (lists), and the reasons plans were skipped. Module-level: a worker runs it."""
    from ..costs.stage import CostModel

    given = {k: v for k, v in combo.items() if v is not None}
    attn = bool(kwargs.get("dp_attention", False))
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    skipped: dict[str, str] = {}
    profile = kwargs.get("profile")
    # a what-if changes the profile as it is built: reused, it would change it twice
    reuse = not any(kwargs.get(k) is not None for k in WHATIF_KNOBS)
    costs: dict = {}
    for g in space.gpus:
        for dp in space.dps:
            for tp, pp, d in dp_splits_of(g, dp, attn):
                if space.splits is not None and (tp, pp) not in space.splits:
                    continue
                for ep in space.expert_parallel:
                    for chunk in space.chunks:
                        base = dict(kwargs, **given, profile=profile, dp=d, enable_expert_parallel=ep)
                        name = split_name(tp, pp, d, attn and d > 1) + (" x EP" if ep else "")
                        try:
                            sc = _structural(tp, pp, base, chunk, space)
                        except UserError as exc:
                            skipped[name] = str(exc)
                            continue
                        if reuse:
                            profile = sc.profile  # resolved once: the catalogue is slow
                        key = (tp, pp, d, ep)
                        if key not in costs:  # the cost model and the batch times it priced
                            costs[key] = (CostModel(sc.box, sc.model, sc.plan, sc.profile), {})
                        cm, ranks = costs[key]
                        fixed = _fixed(sc)
                        for cap in space.running_caps:
                            settings = _with_cap(sc, cap)
                            for load in space.loads:
                                w = _workload(sc, load, space.open_loop, kwargs)
                                est = steady_state(cm, settings, w, ranks)
                                _append(cols, fixed, settings, est, load, space.open_loop, ep, cap, chunk)
    return {"columns": cols, "skipped": skipped}


COLUMNS = (
    "box",
    "engine",
    "model",
    "profile",
    "input_len",
    "output_len",
    "gpus",
    "tp",
    "pp",
    "dp",
    "dp_attention",
    "ep",
    "expert_parallel",
    "running_cap",
    "chunk",
    "cap_given",
    "chunk_given",
    "conc",
    "rate_rps",
    "split",
    "domain",
    "note",
    *(f"model_{m}{end}" for m in MODEL_COLUMNS for end in ("", "_lo", "_hi")),
)


def _structural(tp: int, pp: int, base: dict, chunk: int | None, space: PlanSpace) -> Scenario:
    """The scenario every cap and load of a split shares (built at one client, or at
    the space's highest rate)."""
    engine_kw = {} if chunk is None else {_engine(base).prefill_chunk_knob: chunk}
    load = dict(rate_rps=max(space.loads)) if space.open_loop else dict(concurrency=1)
    return build_scenario(tp=tp, pp=pp, **load, **{**base, **engine_kw})


def _engine(kw: dict) -> type[EngineConfig]:
    """The engine config class a scenario of `kw` runs: the one named, else its profile's
    (build_scenario's rule)."""
    from ..engines import ENGINES
    from ..profiles.profile import DEFAULT_PROFILE, Profile, load_profile

    name = kw.get("engine")
    if not name:
        prof = kw.get("profile")
        name = prof.engine if isinstance(prof, Profile) else load_profile(prof or DEFAULT_PROFILE).engine
    require(name in ENGINES, f"unknown engine '{name}'; known: {', '.join(ENGINES)}")
    return ENGINES[name]


def _with_cap(sc: Scenario, cap: int | None) -> EngineSettings:
    """The scenario's settings with the running cap `cap` (None: as resolved), the
    knobs the engine derives from it derived again unless the user gave them."""
    if cap is None:
        return sc.settings
    cfg = sc.engine
    knob = cfg.running_cap_knob
    changes: dict[str, int | None] = {knob: cap}
    for d in cfg.derived_from.get(knob, ()):
        if sc.knob_sources.get(d) != "user":
            changes[d] = None
    cfg = replace(cfg, **changes)
    cfg.validate()
    return cfg.resolve(sc.box.gpu.memory_bytes, sc.plan, sc.model, sc.memory.kv_tokens, sc.engine_version)


def _workload(sc: Scenario, load: float, open_loop: bool, kwargs: dict) -> Workload:
    """The scenario's workload at `load` (its lengths and seed; the same as building it)."""
    if open_loop:
        return replace(sc.workload, rate_rps=float(load), num_requests=kwargs.get("num_requests") or 200)
    return replace(sc.workload, concurrency=int(load))


def _fixed(sc: Scenario) -> dict:
    """What every plan of a structural scenario shares in its row."""
    plan, wl = sc.plan, sc.workload.describe()
    return dict(
        box=sc.box.name,
        engine=sc.settings.describe()["engine"],
        model=sc.model.name,
        profile=sc.profile.name,
        input_len=wl["input_len"],
        output_len=wl["output_len"],
        gpus=plan.gpus,
        tp=plan.tp,
        pp=plan.pp,
        dp=plan.dp,
        dp_attention=plan.dp_attention,
        ep=plan.ep,
        label=split_name(plan.tp, plan.pp, plan.dp, plan.dp_attention)
        + (f" x EP{plan.ep}" if plan.ep > 1 else ""),
    )


def _append(
    cols: dict[str, list],
    fixed: dict,
    settings: EngineSettings,
    est: Estimate,
    load: float,
    open_loop: bool,
    ep: bool,
    cap: int | None,
    chunk: int | None,
) -> None:
    knobs = [f"cap {settings.running_cap}"] if cap is not None else []
    knobs += [f"chunk {settings.prefill_budget}"] if chunk is not None else []
    label = fixed["label"]
    values = dict(
        {k: v for k, v in fixed.items() if k != "label"},
        expert_parallel=ep,
        running_cap=settings.running_cap,
        chunk=settings.prefill_budget,
        cap_given=cap,
        chunk_given=chunk,
        conc=0 if open_loop else int(load),
        rate_rps=float(load) if open_loop else 0.0,
        split=label + (f" [{', '.join(knobs)}]" if knobs else ""),
        domain=est.domain,
        note=est.notes[0] if est.notes else "",
    )
    for k, v in values.items():
        cols[k].append(v)
    for m in MODEL_COLUMNS:
        lo, hi = est.bounds[m]
        cols[f"model_{m}"].append(getattr(est, m))
        cols[f"model_{m}_lo"].append(lo)
        cols[f"model_{m}_hi"].append(hi)


def screen(space: PlanSpace, kwargs: dict, workers: int | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Every plan of `space` priced by the model (`kwargs`: the build_scenario keywords
    every plan shares): a table, a row per plan, and the plans skipped with why."""
    import pandas as pd

    from .workers import run_tasks

    tasks = [(0, 0, 0, combo) for combo in space.combos()]
    frames, skipped = [], {}
    for out in run_tasks(
        _screen_task, tasks, {"space": space, "kwargs": kwargs}, {}, space.open_loop, workers
    ):
        frames.append(pd.DataFrame(out["columns"]))
        skipped.update(out["skipped"])
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
    require(len(df) > 0, "no plan of the search fits: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    df["output_tok_s_per_gpu"] = df.model_output_throughput_tok_s / df.gpus
    return df, [f"{k}: {v}" for k, v in skipped.items()]


def _screen_task(
    _tp: int, _pp: int, _load: float, shared: dict, _run: dict, _open: bool, combo: dict
) -> dict:
    """One task of `screen` (the signature explore/workers.py runs)."""
    return screen_combo(shared["space"], shared["kwargs"], combo)


def bands(df: pd.DataFrame, error: dict[str, float] | None = None) -> pd.DataFrame:
    """Each plan's band per figure, its bracket widened by the model's measured error:
    columns `band_<figure>_lo` / `_hi`."""
    error = model_error() if error is None else error
    out = df.copy()
    for m in MODEL_COLUMNS:
        e = error.get(m, error.get("output_throughput_tok_s", 0.0))
        if m == "per_request_tok_s":  # a speed is the inverse of TPOT: its error
            e = error.get("tpot_ms", e)
        out[f"band_{m}_lo"] = df[f"model_{m}_lo"] / (1.0 + e)
        out[f"band_{m}_hi"] = df[f"model_{m}_hi"] * (1.0 + e)
    return out


def select(
    df: pd.DataFrame, objective: str, constraints: dict, keep: int | None = MAX_SIMULATE
) -> tuple[pd.DataFrame, str]:
    """The plans worth simulating, best first, and why those. A plan that surely misses
    a constraint (its whole band beyond the limit) or is overloaded is dropped. For
    throughput, per GPU, per request and TTFT: the plans whose band reaches the best
    sure value (the best lower end among the plans that surely qualify, or any
    qualifying one) are kept; `keep` caps them (the best by the model's point).
    max-load and fewest-gpus rank on loads the simulation must confirm: every plan
    not surely out is kept, up to each plan's first sure failure, capped as well."""
    df = bands(df)
    possible = ~df.domain.eq("outside") | df.model_output_throughput_tok_s_hi.gt(0)
    sure = df.domain.ne("outside")
    for k, limit in constraints.items():
        col, at_most, _ = CONSTRAINTS[k]
        m = SCREENED.get(col, "per_request_tok_s")
        lo, hi = df[f"band_{m}_lo"], df[f"band_{m}_hi"]
        if at_most:
            possible &= lo <= limit
            sure &= hi <= limit
        else:
            possible &= hi >= limit
            sure &= lo >= limit
    if (df.rate_rps > 0).any():
        over = df.note.str.startswith("overloaded")
        possible &= ~over
    cand = df[possible]
    require(
        len(cand) > 0,
        "no plan can meet "
        + ", ".join(CONSTRAINTS[k][2].format(v) for k, v in constraints.items())
        + " by the steady-state model's bands; relax a limit, or --simulate-all to simulate every plan",
    )
    if objective in ("max-load", "fewest-gpus"):
        chosen = _loads_up_to_failure(df, possible)
        why = (
            f"{len(chosen)} plans whose bands may meet the constraints ({objective} ranks on simulated loads)"
        )
    else:
        col, larger, _ = OBJECTIVES[objective]
        figure_of = {
            "output_throughput_tok_s": "output_throughput_tok_s",
            "output_tok_s_per_gpu": "output_throughput_tok_s",
        }
        fig = figure_of.get(col, "per_request_tok_s" if col == "per_request_tok_s" else "ttft_ms")
        scale = 1.0 / df.gpus if col == "output_tok_s_per_gpu" else 1.0
        lo, hi = df[f"band_{fig}_lo"] * scale, df[f"band_{fig}_hi"] * scale
        point = df[f"model_{fig}"] * scale
        pool = sure & possible if (sure & possible).any() else possible
        if larger:
            bar = lo[pool].max()
            reach = possible & (hi >= bar)
            order = point.where(point == point, hi)
        else:
            bar = hi[pool].min()
            reach = possible & (lo <= bar)
            order = -point.where(point == point, lo)
        chosen = df[reach].assign(_order=order[reach]).sort_values("_order", ascending=False, kind="stable")
        chosen = chosen.drop(columns="_order")
        why = f"{len(chosen)} plans whose band reaches the best sure {OBJECTIVES[objective][2]} ({bar:,.1f})"
    if keep is not None and len(chosen) > keep:
        why += f"; the {keep} best by the model's point simulated"
        if objective not in ("max-load", "fewest-gpus"):
            why += ", one of each figure first"
            chosen = _one_of_each_first(chosen, order[chosen.index])
        chosen = chosen.head(keep)
    return chosen, why


def _one_of_each_first(chosen: pd.DataFrame, order: pd.Series) -> pd.DataFrame:
    """`chosen` (best first by `order`, the model's figure) with the plans the model
    cannot tell apart (the same figure to 0.1%: knobs that do not move its estimate,
    or plans bound by the same output path) after one of each, so that a capped budget
    of simulations spreads over what the model ranks before it repeats a figure
    (docs/search.md §3)."""
    repeat, first, n = [], math.nan, 0
    for v in order.to_numpy():  # best first: a tier runs while within 0.1% of its first
        if not abs(v - first) <= 1e-3 * abs(first):
            first, n = v, 0
        repeat.append(n)
        n += 1
    return chosen.assign(_repeat=repeat).sort_values("_repeat", kind="stable").drop(columns="_repeat")


def _loads_up_to_failure(df: pd.DataFrame, possible: pd.Series) -> pd.DataFrame:
    """Per plan (all but its load), its loads up to its first that surely fails: a
    max-load ranking needs every smaller load of a plan."""
    key = [c for c in ("box", "engine", "input_len", "output_len", "split") if c in df.columns]
    load = df.rate_rps.where(df.rate_rps > 0, df.conc)
    keep = []
    for _, part in df.assign(_load=load, _ok=possible).groupby(key, sort=False):
        part = part.sort_values("_load")
        fails = part[~part._ok]
        limit = fails._load.iloc[0] if len(fails) else math.inf
        keep.append(part[part._load < limit])
    import pandas as pd

    return pd.concat(keep).drop(columns=["_load", "_ok"]) if keep else df.iloc[:0]

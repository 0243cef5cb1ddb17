"""A two-stage search's plans: every plan of the space priced by the steady-state model
(screen.py), then the ones worth it simulated as a sweep's rows (sweep.run_point), each
row carrying the model's figures and bands beside the simulation's. search.py ranks
those rows as it ranks a sweep."""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from ..base.checks import MAX_CONCURRENCY, MAX_SIMULATE
from ..base.errors import require
from ..base.progress import bar as progress_bar
from ..engines import ENGINES
from .grid import choices, positive_numbers, whole_numbers
from .screen import MODEL_COLUMNS, PlanSpace, model_error, screen, select
from .sweep import run_point

if TYPE_CHECKING:
    import pandas as pd

LIST_KEYS = ("box", "engine", "input_len", "output_len")
MAX_SCREEN_PLANS = 2_000_000  # a screen's plans: each is a model evaluation (~0.1-1 ms), not a run


def two_stage(
    gpus: int | Sequence[int],
    objective: str,
    conc: int | Sequence[int] | None,
    rate: float | Sequence[float] | None,
    splits: Sequence[tuple[int, int]] | None,
    constraints: dict,
    kwargs: dict,
    *,
    simulate: int | None = MAX_SIMULATE,
    running_caps: Sequence[int] | None = None,
    chunks: Sequence[int] | None = None,
    expert_parallel: Sequence[bool] | None = None,
) -> tuple[pd.DataFrame, str]:
    """The simulated rows of a two-stage search and what its screen did, in words.
    `kwargs`: the sweep's keywords (dp, box, engine, lengths, workers, ...); `simulate`:
    at most this many plans simulated (None: every one the bands keep)."""
    import pandas as pd

    from ..api import RUN_KEYS

    kwargs = dict(kwargs)
    for values, knob in ((running_caps, "running_cap_knob"), (chunks, "prefill_chunk_knob")):
        given = [k for k in {getattr(c, knob) for c in ENGINES.values()} if kwargs.get(k) is not None]
        require(
            not (values and given),
            f"{', '.join(given)} and a list of {'running caps' if knob == 'running_cap_knob' else 'chunks'} "
            "both set the same knob; give one",
        )
    workers, scheduler = kwargs.pop("workers", None), kwargs.pop("scheduler", None)
    progress = kwargs.pop("progress", False)
    run_kwargs = {k: kwargs.pop(k) for k in RUN_KEYS if k in kwargs}
    open_loop = rate is not None
    lists = {k: tuple(choices(kwargs.pop(k, None), k.replace("_", " "))) for k in LIST_KEYS}
    ep_flag = bool(kwargs.pop("enable_expert_parallel", False))
    space = PlanSpace(
        gpus=tuple(whole_numbers(gpus, "gpus")),
        loads=tuple(
            positive_numbers(rate, "rate") if open_loop else whole_numbers(conc, "conc", MAX_CONCURRENCY)
        ),
        open_loop=open_loop,
        splits=None if splits is None else tuple((tp, pp) for tp, pp in splits),
        dps=tuple(whole_numbers(kwargs.pop("dp", 1), "dp")),
        expert_parallel=tuple(expert_parallel) if expert_parallel is not None else (ep_flag,),
        running_caps=tuple(running_caps) if running_caps else (None,),
        chunks=tuple(chunks) if chunks else (None,),
        boxes=lists["box"],
        engines=lists["engine"],
        input_lens=lists["input_len"],
        output_lens=lists["output_len"],
    )
    require(
        space.size <= MAX_SCREEN_PLANS,
        f"the search's plan space holds {space.size:,} plans, above the limit of {MAX_SCREEN_PLANS:,}; "
        "shorten a list (loads, caps, chunks, boxes, engines, lengths)",
    )
    if open_loop:
        kwargs["num_requests"] = kwargs.get("num_requests") or 200
    t = time.perf_counter()
    plans, skipped = screen(space, kwargs, workers)
    screen_s = time.perf_counter() - t
    chosen, why = select(plans, objective, constraints, simulate)
    tasks = [
        (int(r.tp), int(r.pp), r.rate_rps if open_loop else r.conc, _combo(r, i))
        for i, r in chosen.iterrows()
    ]
    from .workers import run_tasks

    rows = []
    t = time.perf_counter()
    with progress_bar(len(tasks), "simulate", progress, leave=True) as bar:
        for row in run_tasks(_simulate, tasks, kwargs, run_kwargs, open_loop, workers, scheduler):
            rows.append(row)
            bar.update()
    sim_s = time.perf_counter() - t
    table = pd.DataFrame(rows).set_index("plan_index").sort_index()
    model = chosen[[c for c in chosen.columns if c.startswith(("model_", "band_"))] + ["split", "domain"]]
    table = table.drop(columns="split").join(model.rename(columns={"domain": "model_domain"}))
    table = table.reset_index(drop=True)
    table.attrs["skipped"] = skipped
    errors = ", ".join(f"{k.split('_')[0]} {v:.0%}" for k, v in model_error().items())
    text = (
        f"two-stage: the steady-state model priced {len(plans):,} plans in {screen_s:.1f} s; simulated "
        f"{len(rows)} in {sim_s:.1f} s: {why} (bands: the model's bracket widened by its 90th percentile error "
        f"against the simulation, {errors}; docs/search.md)"
    )
    return table, text


def _combo(r: pd.Series, index: Hashable) -> dict:
    """What a simulated plan is built with beside its split and load: its box, engine,
    lengths, data-parallel ranks, expert parallel and the knobs the plan sets."""
    from ..engines import ENGINES

    cfg = ENGINES[r.engine]
    combo = dict(
        box=r.box,
        engine=r.engine,
        input_len=r.input_len,
        output_len=r.output_len,
        dp=int(r.dp),
        enable_expert_parallel=bool(r.expert_parallel),
        plan_index=index,
    )
    if r.cap_given == r.cap_given and r.cap_given is not None:
        combo[cfg.running_cap_knob] = int(r.cap_given)
    if r.chunk_given == r.chunk_given and r.chunk_given is not None:
        combo[cfg.prefill_chunk_knob] = int(r.chunk_given)
    return combo


def _simulate(
    tp: int, pp: int, load: float, shared: dict, run_kwargs: dict, open_loop: bool, combo: dict
) -> dict:
    """One plan simulated as a sweep's row, keyed by its place in the screen's table
    (module-level: a worker runs it)."""
    combo = dict(combo)
    index = combo.pop("plan_index")
    return {**run_point(tp, pp, load, shared, run_kwargs, open_loop, combo), "plan_index": index}


def model_text(r: dict) -> str:
    """A ranked row's model figure and band, where a two-stage search priced it."""
    m = "output_throughput_tok_s"
    point, lo, hi = r.get(f"model_{m}"), r.get(f"band_{m}_lo"), r.get(f"band_{m}_hi")
    if point is None or lo is None:
        return ""
    shown = "outside its domain" if point != point else f"{point:,.0f}"
    return f"  model {shown} [{lo:,.0f}, {hi:,.0f}]"


__all__ = ["MODEL_COLUMNS", "model_text", "two_stage"]

"""The scenarios of a sweep: every combination of its lists (boxes x engines x input
lengths x output lengths x TP x PP splits x loads), each named by its key.

Every scenario is built (`build_scenario`) before any runs, so a bad one is said at once
and the sweep's size and total work are known: both are bounded (checks.MAX_SWEEP_SCENARIOS,
checks.MAX_SWEEP_BATCH_STEPS). A split the model does not fit, or a scenario above a
limit, is skipped with the reason it gave. The key of a scenario is the values its row
carries in KEY_COLUMNS (the resolved box and engine names, the length specs as the
workload writes them), so a row read back from a file is matched to its scenario exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..base.checks import MAX_GPUS, check_sweep_size, check_sweep_work, is_int
from ..base.errors import UserError, require
from ..scenario.build import build_scenario, scenario_steps

if TYPE_CHECKING:
    from ..scenario.build import Scenario
    from .objectives import Row

KEY_COLUMNS = ("box", "engine", "input_len", "output_len", "gpus", "tp", "pp", "dp", "conc", "rate_rps")
# the swept lists of scenario inputs: build_scenario's argument -> what the user calls it
LIST_ARGS = {"box": "box", "engine": "engine", "input_len": "input length", "output_len": "output length"}


@dataclass(frozen=True)
class Point:
    """One scenario: its key (KEY_COLUMNS), split, load (a concurrency, or an arrival rate
    in req/s), the index of its box, engine and lengths in `Grid.combos`, its work, and
    its data-parallel ranks."""

    key: tuple
    tp: int
    pp: int
    load: float
    combo: int
    steps: float
    dp: int = 1


@dataclass(frozen=True)
class Grid:
    points: tuple[Point, ...]
    combos: tuple[dict, ...]  # {box, engine, input_len, output_len}: the values given (None: default)
    skipped: tuple[str, ...]  # 'TPa x PPb (N GPUs): reason' for the scenarios left out

    @property
    def work_steps(self) -> float:
        return sum(p.steps for p in self.points)


def choices(value: object, what: str) -> list:
    """A sweep list: one value or a sequence of them -> the distinct values in the order given
    (None: the default, one value). Lengths may be whole numbers or specs ('300', '100:500')."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    require(len(values) > 0, f"{what} is empty; give at least one value")
    out, seen = [], set()
    for v in values:
        text = str(v) if isinstance(v, (str, int)) else repr(v) if v is None else getattr(v, "name", repr(v))
        if text not in seen:
            seen.add(text)
            out.append(v)
    return out


def check_lists(lists: dict[str, Sequence]) -> None:
    """Each listed value is one a scenario takes: a known engine, a box that loads, a
    length spec. Said at once: a typo in one value would otherwise skip all its scenarios."""
    from ..engines import ENGINES
    from ..inputs.box import load_box
    from ..inputs.workload import Lengths

    for e in lists["engine"]:
        require(e is None or e in ENGINES, f"unknown engine '{e}'; known: {', '.join(ENGINES)}")
    for b in lists["box"]:
        if isinstance(b, str):
            load_box(b)
    for k in ("input_len", "output_len"):
        for v in lists[k]:
            Lengths.parse(v, LIST_ARGS[k])


def check_priced(lists: dict[str, Sequence], kwargs: Mapping) -> None:
    """Each listed box has costs for each listed engine when no profile is named (its own
    measured profile, AIConfigurator's tables of its GPU, or the roofline: catalogue.py).
    Said at once: a box without them would otherwise lose every row to one reason."""
    from ..inputs.box import Box, load_box
    from ..inputs.model import Model
    from ..profiles.catalogue import profile_for_box
    from ..profiles.profile import DEFAULT_PROFILE, load_profile
    from ..scenario.build import DEFAULT_MODEL

    if kwargs.get("profile") is not None:
        return
    default = load_profile(DEFAULT_PROFILE)
    model = kwargs.get("model")
    model = model.name if isinstance(model, Model) else model or DEFAULT_MODEL
    for b in lists["box"]:
        for e in lists["engine"]:
            if b is None and e in (None, default.engine):
                continue  # the default profile: nothing to look up
            box = b if isinstance(b, Box) else load_box(b or default.box)
            try:
                profile_for_box(box, e or default.engine, model, kwargs.get("engine_version"))
            except UserError as exc:
                text = str(exc)
                raise UserError(text if box.name in text else f"box {box.name}: {text}") from None


def split_name(tp: int, pp: int, dp: int = 1, dp_attention: bool = False) -> str:
    """'TP2 x PP4'; with data parallel 'TP4 x PP1 x DP2', 'TP8 x PP1 x DP4-attn' (SGLang's
    DP attention: the dp ranks split the tp GPUs)."""
    return f"TP{tp} x PP{pp}" + (f" x DP{dp}{'-attn' if dp_attention else ''}" if dp > 1 else "")


def splits_of(gpus: int) -> list[tuple[int, int]]:
    """Every (tp, pp) with tp x pp = gpus, TP largest first."""
    return [(gpus // pp, pp) for pp in range(1, gpus + 1) if gpus % pp == 0]


def dp_splits_of(gpus: int, dp: int, dp_attention: bool) -> list[tuple[int, int, int]]:
    """The (tp, pp, dp) splits of `gpus` GPUs with `dp` data-parallel ranks, which pipesim
    simulates with pp = 1 (dataparallel.py): tp = gpus with SGLang's DP attention (the
    ranks split the tp GPUs, dp must divide tp), else tp = gpus / dp (dp replicas or
    vLLM's ranks, tp x dp GPUs); none when dp does not divide the count."""
    if dp == 1:
        return [(tp, pp, 1) for tp, pp in splits_of(gpus)]
    if gpus % dp:
        return []
    return [(gpus, 1, dp)] if dp_attention else [(gpus // dp, 1, dp)]


def scenario_key(sc: Scenario, load: float, open_loop: bool) -> tuple:
    """The KEY_COLUMNS of a built scenario at `load`, as `sweep.run_point` writes them."""
    w = sc.workload.describe()
    plan = sc.plan
    conc, rate = (0, float(load)) if open_loop else (int(load), 0.0)
    return (
        sc.box.name,
        sc.settings.describe()["engine"],
        w["input_len"],
        w["output_len"],
        plan.gpus,
        plan.tp,
        plan.pp,
        plan.dp,
        conc,
        rate,
    )


def row_key(row: Row) -> tuple:
    """The key of a sweep row (a dict or a table row), typed as `scenario_key` gives it."""
    box, engine, inp, out, g, tp, pp, dp, c, r = (row[k] for k in KEY_COLUMNS)
    return (str(box), str(engine), str(inp), str(out), int(g), int(tp), int(pp), int(dp), int(c), float(r))


def _label(combo: dict, several: bool) -> str:
    """' [box b, engine vllm, ...]' naming a combination, when the sweep has several."""
    if not several:
        return ""
    parts = [f"{LIST_ARGS[k]} {getattr(v, 'name', v)}" for k, v in combo.items() if v is not None]
    return f" [{', '.join(parts)}]" if parts else " [defaults]"


def build_grid(
    gpu_counts: list[int],
    loads: Sequence[float],
    open_loop: bool,
    kwargs: dict,
    lists: dict[str, Sequence],
    only: list[tuple[int, int]] | None = None,
    dps: Sequence[int] = (1,),
) -> Grid:
    """Every scenario of the sweep, built and checked, in table order: by combination
    (boxes, engines, input lengths, output lengths as listed), then gpus, tp, pp, dp, load.
    `lists` maps each of LIST_ARGS to its values; `dps` the data-parallel sizes swept
    (`dp_splits_of`; `kwargs` may say dp_attention). A split that no load accepts is
    skipped with its reason, as is a single scenario; a reason every scenario shares (an
    unknown model, a bad knob) is not about the sweep's lists and is raised as is."""
    from itertools import product

    check_lists(lists)
    check_priced(lists, kwargs)
    combos = [dict(zip(LIST_ARGS, values, strict=True)) for values in product(*(lists[k] for k in LIST_ARGS))]
    attn = bool(kwargs.get("dp_attention", False))
    split_list = [
        s
        for g in gpu_counts
        for dp in dps
        for s in dp_splits_of(g, dp, attn)
        if only is None or s[:2] in only
    ]
    split_list.sort(key=lambda s: (s[0] * s[1] * (1 if attn else s[2]), s[0], s[1], s[2]))
    check_sweep_size(len(combos), len(split_list), len(loads))
    several = len(combos) > 1
    points: list[Point] = []
    reasons: dict[str, str] = {}
    seen: dict[tuple, int] = {}  # scenario key -> its combination
    for i, combo in enumerate(combos):
        given = {k: v for k, v in combo.items() if v is not None}
        for tp, pp, dp in split_list:
            failed: dict[float, str] = {}
            for load in loads:
                load_kw = dict(rate_rps=load) if open_loop else dict(concurrency=int(load))
                try:
                    sc = build_scenario(tp=tp, pp=pp, dp=dp, **load_kw, **kwargs, **given)
                except UserError as exc:
                    failed[load] = str(exc)
                    continue
                key = scenario_key(sc, load, open_loop)
                require(
                    key not in seen,
                    f"the sweep's lists give one scenario twice ({', '.join(map(str, key))}): "
                    f"{_label(combos[seen.get(key, i)], True).strip(' []')} and {_label(combo, True).strip(' []')} "
                    "resolve to the same box, engine and lengths; list each once",
                )
                seen[key] = i
                points.append(Point(key, tp, pp, float(load), i, scenario_steps(sc)[0], dp))
            gpus = tp * pp * (1 if attn else dp)
            name = f"{split_name(tp, pp, dp, attn and dp > 1)} ({gpus} GPUs){_label(combo, several)}"
            if len(failed) == len(loads) and len(set(failed.values())) == 1:
                reasons[name] = failed[loads[0]]  # the split, whatever the load
            else:
                what = "rate" if open_loop else "C"
                reasons.update({f"{name} at {what}={load:g}": why for load, why in failed.items()})
    if not points:
        distinct = set(reasons.values())
        if len(distinct) == 1 and len(reasons) > 1:
            raise UserError(distinct.pop())
        raise UserError(
            f"no valid TP x PP split for {', '.join(map(str, gpu_counts))} GPUs: "
            + "; ".join(f"{k.split(' (')[0]}: {v}" for k, v in reasons.items())
        )
    grid = Grid(tuple(points), tuple(combos), tuple(f"{k}: {v}" for k, v in reasons.items()))
    check_sweep_work(grid.work_steps, len(grid.points))
    return grid


def whole_numbers(values: object, what: str, limit: int = MAX_GPUS) -> list[int]:
    """An int or a sequence of ints -> sorted and distinct; each from 1 to `limit`, at
    least one. (The command line turns '1,8,32' into a list first: `cli.options.parse_ints`.)"""
    if is_int(values):
        values = [values]
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):  # a bool, None
        raise UserError(f"{what} {values!r} must be a whole number or a sequence of them, e.g. [1, 8, 32]")
    values = list(values)
    require(len(values) > 0, f"{what} is empty; give at least one whole number >= 1, e.g. 1,8,32")
    for v in values:
        require(is_int(v) and v >= 1, f"{what}: {v!r} is not a whole number >= 1")
        require(v <= limit, f"{what}: {v} is above the limit of {limit}")
    return sorted({int(v) for v in values})


def positive_numbers(values: object, what: str) -> list[float]:
    """A number or a sequence of numbers -> sorted and distinct; each finite and > 0."""
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):  # a bool, None
        raise UserError(f"{what} {values!r} must be a number or a sequence of them, e.g. [0.5, 1, 2]")
    values = list(values)
    require(len(values) > 0, f"{what} is empty; give at least one number > 0, e.g. 0.5,1,2")
    for v in values:
        require(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf"),
            f"{what}: {v!r} is not a number > 0",
        )
    return sorted(set(float(v) for v in values))

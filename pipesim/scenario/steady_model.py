"""A scenario's steady state in closed form: throughput, per-request speed, TTFT and
TPOT from the engine's slot schedule and the cost model, without simulating.

Why here: it reads what a built scenario holds (box, model, plan, engine settings,
workload, profile), the cost model's seconds (costs/) and the engine's admission rule
(scenario/admission.py), and nothing the simulation records; so it sits on the
scenario floor, beside the admission rule it extends (how many requests run at once
-> how fast they run), where both the API and a search's screen (explore/) reach it.

The model is the simulation's own rules, taken at steady state (docs/search.md §1):

- Occupancy: which slots (SGLang: pp + async depth slots, each up to its per-slot cap;
  vLLM: up to max_concurrent_batches implicit groups; V0: a virtual engine per stage)
  hold how many of the A admitted requests (admission.py). Requests enter in prefill
  cohorts of the budget's whole prompts (beside their group's decodes where prompts
  and decodes mix) and stay in their slot (sticky); the serial front end hands them
  over one at a time, so the idle engine's first batches take what has arrived
  (`cohorts`). `formation`: the cohorts each in the slot whose turn it was (the
  clients' first burst; a queue keeps it). `clumped`: slots filled to their cap.
- A round (every occupied slot launched once) lasts the max-plus period of the slots'
  batches circulating through the stations: max(the slowest batch's cycle, its trip
  back to the first stage and the engine loop's CPU as the release hides it, the
  busiest stage's sum of its batches, each rank's loop for every iteration of the
  round); the costs are CostModel.stage_time and hop_time of the batch's shape, padded
  as the engine pads it, and the host loop's (host_loop.py: costs/host.py's terms and
  `compose`).
- Prefill: every cohort's prompt takes a slot's turn once per request lifetime
  (SGLang: instead of that slot's decode; vLLM: mixed into it), and the round it is in
  lasts the same period with that batch in it.
- A closed loop's clients cycle through the output path, tokenize, the wait for a
  turn, the prefill and O - 1 decode rounds; Little's law gives the throughput, and
  the serial output path and API process cap it. An open loop holds arrival rate x
  stay requests (a fixed point) below saturation (open_loop.py).

Where it is not the simulation's answer it says so (`Estimate.domain`): a pipeline
whose several slots or groups fill as requests happen to reach the scheduler is
bracketed between the fillings the engine's rules allow (the fewest slots, an even
spread); KV-bound runs (evictions), open loops near saturation, traces and vLLM's async
scheduling with PP are outside its domain and get only an upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..inputs.workload import ArrivalPlan
from .admission import admission
from .host_loop import host_loop
from .open_loop import open_loop
from .slot_schedule import RankEstimate, RankSchedule, State

if TYPE_CHECKING:
    from ..costs.stage import CostModel
    from ..engines.protocol import EngineSettings
    from ..inputs.workload import Workload
    from .build import Scenario

METRICS = ("output_throughput_tok_s", "per_request_tok_s", "ttft_ms", "tpot_ms")


@dataclass(frozen=True)
class Estimate:
    """The model's figures for a scenario (every DP rank together), the occupancy
    bracket of each (lo, hi: equal when the occupancy is determined), and its domain:
    "in", "bracketed" (a pipeline's slots may fill otherwise: the point is the engine's
    formation, the bracket reaches the other fillings) or "outside" (the point is
    nan; `bounds` holds only what the physics caps: throughput and per-request speed at
    most, TTFT and TPOT at least)."""

    output_throughput_tok_s: float
    request_throughput_req_s: float
    per_request_tok_s: float
    ttft_ms: float
    tpot_ms: float
    bounds: dict  # metric -> (lo, hi)
    domain: str
    notes: tuple[str, ...]
    admitted: int
    occupancy: tuple[int, ...]  # requests per occupied slot (group), one rank, at the point
    round_ms: float
    overloaded: bool = False  # an open loop above the model's capacity
    states: tuple[State, ...] = field(default=(), repr=False)

    def band(self, metric: str, error: float = 0.0) -> tuple[float, float]:
        """`metric`'s interval: its bracket widened by a relative `error` either way
        (the model's measured error against the simulation, docs/search.md §2)."""
        lo, hi = self.bounds[metric]
        return lo / (1.0 + error), hi * (1.0 + error)


def estimate(scenario: Scenario) -> Estimate:
    """The steady state of a built scenario (module docstring)."""
    from ..costs.stage import CostModel

    costs = CostModel(scenario.box, scenario.model, scenario.plan, scenario.profile)
    return steady_state(costs, scenario.settings, scenario.workload)


def steady_state(
    costs: CostModel, settings: EngineSettings, workload: Workload, ranks: dict | None = None
) -> Estimate:
    """The steady state of an engine run with `settings` on `costs` (its plan, box,
    model and profile) under `workload`. A search varies the settings and the workload
    over one cost model, whose stage times it caches; `ranks` (a dict the caller keeps
    per cost model) keeps the batch times of each settings and lengths too."""
    plan = costs.plan
    adm = admission(workload, settings, plan.dp)
    fixed = (
        workload.input_len.lo == workload.input_len.hi and workload.output_len.lo == workload.output_len.hi
    )
    notes: list[str] = [] if fixed or workload.kind == "trace" else ["lengths vary: their means are taken"]
    outside = []
    if workload.kind == "trace":
        outside.append("a trace's arrivals come in bursts: no steady state")
    if workload.kind == "closed" and adm.reason == "KV cache" and adm.cap < workload.concurrency:
        outside.append(f"the KV cache bounds the running requests at {adm.cap}: evictions are not modelled")
    if settings.inflight_groups and settings.batches_per_request > 1 and plan.pp > 1:
        outside.append(
            "vLLM's async scheduling with PP (placeholders re-scheduled pp steps on) is not modelled"
        )
    key = (settings, workload.input_len, workload.output_len, bool(outside))
    rank = None if ranks is None else ranks.get(key)
    if rank is None:
        rank = RankSchedule(costs, settings, host_loop(costs.host, settings), workload, bound=bool(outside))
        if ranks is not None:
            ranks[key] = rank
    if outside:  # only what the physics caps: no latency in the round, no KV limit
        nominal = min(
            workload.concurrency or adm.running_cap, adm.running_cap, adm.slot_cap or adm.running_cap
        )
        est = rank.closed(max(1, nominal), max(1, nominal), fixed=False)
        return _assemble(est, plan.dp, "outside", notes + outside, adm.admitted)
    if workload.kind == "closed":
        est = rank.closed(adm.admitted, workload.concurrency, fixed=fixed)
    else:
        span = ArrivalPlan(workload, np.random.default_rng(workload.seed)).span_s
        assert span is not None  # an open loop's plan knows its first and last arrival
        last = span[1]
        est = open_loop(
            rank,
            workload.rate_rps / plan.dp,
            max(1, adm.cap // plan.dp),
            workload.num_requests // plan.dp,
            last,
        )
    return _assemble(est, plan.dp, est.domain, notes + list(est.notes), adm.admitted)


def _figures(st: State, dp: int) -> dict:
    """A state's figures for the whole engine (`dp` ranks alike)."""
    return {
        "output_throughput_tok_s": st.output_tok_s * dp,
        "per_request_tok_s": 1.0 / st.tpot_s if st.tpot_s > 0 else math.inf,
        "ttft_ms": st.ttft_s * 1e3,
        "tpot_ms": st.tpot_s * 1e3,
    }


def _assemble(est: RankEstimate, dp: int, domain: str, notes: list[str], admitted: int) -> Estimate:
    """One rank's states as the engine's estimate: the first state is the point, the
    bracket spans them all; outside the domain the point is nan and the bracket is
    what the physics caps (module docstring)."""
    figs = [_figures(st, dp) for st in est.states]
    point, st = figs[0], est.states[0]
    if domain == "outside":
        bounds = {
            "output_throughput_tok_s": (0.0, max(f["output_throughput_tok_s"] for f in figs)),
            "per_request_tok_s": (0.0, max(f["per_request_tok_s"] for f in figs)),
            "ttft_ms": (min(f["ttft_ms"] for f in figs), math.inf),
            "tpot_ms": (min(f["tpot_ms"] for f in figs), math.inf),
        }
        point = dict.fromkeys(METRICS, math.nan)
        rate = math.nan
    else:
        bounds = {m: (min(f[m] for f in figs), max(f[m] for f in figs)) for m in METRICS}
        rate = st.request_rate * dp
    return Estimate(
        output_throughput_tok_s=point["output_throughput_tok_s"],
        request_throughput_req_s=rate,
        per_request_tok_s=point["per_request_tok_s"],
        ttft_ms=point["ttft_ms"],
        tpot_ms=point["tpot_ms"],
        bounds=bounds,
        domain=domain,
        notes=tuple(notes),
        admitted=admitted,
        occupancy=st.sizes,
        round_ms=st.round_s * 1e3,
        overloaded=est.overloaded,
        states=est.states,
    )

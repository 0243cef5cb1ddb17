"""Metrics: what a run measured, read from its `Record` once the run is over.

The measurement window is [warm-up end, stop] for a closed loop (the first C
requests are warm-up) and the whole run for open loops and traces. The run's rows are
already folded into figures over the window (tally.py: every row counts for its part
inside the window); a stage's bubble is the part of the window it was not busy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from ..base.errors import UserError
from .record import Record
from .request_tally import ROW_COLUMNS
from .rows import LOOP_PARTS, PROCESS_PARTS
from .sketch import percentile
from .steady import closed_loop_ci, queue_wait_s, slot_orbits
from .tally import InflightGroups

if TYPE_CHECKING:
    import pandas as pd

REQUEST_COLUMNS = (*ROW_COLUMNS, "ttft_ms", "tpot_ms", "decode_tok_s", "e2e_ms")
STAGE_COLUMNS = ("stage", "layers", "compute", "allreduce", "busy", "idle")


# ---- where each stage's idle time went ------------------------------------------------


@dataclass(frozen=True)
class StageIdle:
    """One stage's share of the window, by what its GPUs did or waited for."""

    stage: int
    compute: float
    allreduce: float
    idle_p2p: float  # idle while a hop into the stage was in flight
    idle_cpu: float  # idle while the scheduler CPU worked (stage 0 only)
    idle_bubble: float  # idle with nothing in flight towards it: the pipeline bubble
    bubbles: int  # idle stretches (gaps between busy stretches) in the window
    bubble_s: float  # their total length (= idle share x window)


def idle_breakdown(rec: Record) -> list[StageIdle]:
    """Per stage, compute / all-reduce / idle-by-cause shares of the window.

    Idle time is split by what the idle stage was waiting for: a hop into it in
    flight (P2P), the scheduler CPU at work (stage 0, where the scheduler runs), or
    neither (the pipeline bubble proper). Each part is the idle time those intervals
    cover, taken in that order, so the parts add up to the stage's idle share
    (tally.StepTally's covered seconds)."""
    t0, t1 = rec.window_s
    span = max(t1 - t0, 1e-12)
    st = rec.steps
    out = []
    for s in range(rec.pp):
        compute, comm, busy, with_hop, with_cpu = st.covered[s]
        out.append(
            StageIdle(
                stage=s,
                compute=compute / span,
                allreduce=comm / span,
                idle_p2p=(with_hop - busy) / span,
                idle_cpu=(with_cpu - with_hop) / span,
                idle_bubble=(span - with_cpu) / span,
                bubbles=st.bubbles[s],
                bubble_s=st.bubble_s[s],
            )
        )
    return out


@dataclass(frozen=True, repr=False)
class Result:
    """One prediction, a value: built whole by `collect` (its intervals added as a
    changed copy, report/uncertainty.py `attach`). Scalars for reports; `requests` and
    `stages` as DataFrames, built on first use from numpy columns (pandas is imported
    only then: a prediction needs none)."""

    scenario: dict
    window_s: tuple[float, float]
    output_throughput_tok_s: float
    output_throughput_ci_tok_s: float  # 95% half-width (batch means)
    request_throughput_req_s: float
    per_request_tok_s: float
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    tpot_ms_mean: float
    tpot_ms_p50: float
    tpot_ms_p99: float
    e2e_ms_mean: float
    bubble_fraction: float
    stage_busy_fraction: list
    time_shares: dict
    allreduce_share: float
    p2p_share: float
    cpu_share: float
    link_wait_share: float  # share of the window some transfer waited for a busy PCIe link
    mean_requests_per_microbatch: float
    mean_decode_batch: float
    decode_batch_per_slot: list  # mean decode batch of each micro-batch slot (0: unused)
    # vLLM: mean requests of each batch in flight at a launch, largest first (one entry
    # per max_concurrent_batches), the analogue of decode_batch_per_slot; None for SGLang
    group_sizes: list | None
    # the batches in flight by position, fullest first (one position per slot, vLLM: per
    # group; occupancy.py): mean requests of the k-th fullest over the window, and the
    # share of the window with no k-th batch in flight; None with DP ranks
    occupancy_by_position: list | None
    empty_share_by_position: list | None
    # running requests evicted for KV in the window (SGLang retract_decode, vLLM
    # recompute preemption; docs/engines.md §4), and in the whole run
    preemptions: int
    preemptions_total: int
    completed_requests: int
    # the measured requests repeat every this many (a deterministic run's cycle, measured
    # in whole periods: its CI is float rounding and its figures the long run's; 0: none)
    period_requests: int
    sim_events: int
    sim_wall_s: float
    saturation: dict | None  # open loop: arrivals against service (saturation.py); closed: None
    # the TTFT / TPOT percentiles' stated relative error: 0 when exact; sketch.REL_ERROR when
    # an open loop measured more requests than it keeps values of (sketch.EXACT_VALUES)
    percentile_rel_error: float
    # REQUEST_COLUMNS -> array, measured requests by rid (empty: an open loop's summary
    # run keeps no request; record="full" keeps them)
    request_columns: dict = field(repr=False)
    stage_columns: dict = field(repr=False)  # STAGE_COLUMNS -> array, one row per stage
    # an open loop's or a trace's headline figures per stretch of its requests in completion
    # order (stretches.py; empty for a closed loop): its band's workload part, from the run
    stretch_samples: dict = field(default_factory=dict, repr=False)
    # prediction intervals (pipesim.report.uncertainty): metric -> (lo, hi), empty unless asked for
    intervals: dict = field(default_factory=dict)
    interval_basis: dict = field(default_factory=dict)  # what each part of the band contributed
    provenance_shares: dict = field(default_factory=dict)  # share of stage time by cost provenance (costs.py)
    # data parallelism (dataparallel.py): ranks, lock step, requests per rank, dummy-step
    # share per rank; empty with one rank
    data_parallel: dict = field(default_factory=dict)
    # the engine loop's busy share by part (LOOP_PARTS; they sum to cpu_share), and the
    # busy share of the host's other processes (PROCESS_PARTS: the output path's
    # detokenizer and API-process streaming, the front end), each a process of its own
    cpu_parts: dict = field(default_factory=dict)
    host_processes: dict = field(default_factory=dict)

    def __str__(self) -> str:
        """One line: the scenario and its headline numbers with their bands (result_view.py)."""
        from .result_view import short

        return short(self)

    def __repr__(self) -> str:
        return f"<pipesim Result {self}>"

    def _repr_html_(self) -> str:
        """A notebook's view: the headline numbers and their bands as a table."""
        from .result_view import html

        return html(self)

    @cached_property
    def requests(self) -> pd.DataFrame:
        if not self.request_columns:
            raise UserError(
                "this open-loop run kept no per-request rows (its figures were taken as the requests "
                "finished); predict(..., record='full') keeps them"
            )
        import pandas as pd

        return pd.DataFrame({c: self.request_columns[c] for c in REQUEST_COLUMNS})

    @cached_property
    def stages(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({c: self.stage_columns[c] for c in STAGE_COLUMNS})

    def to_dict(self) -> dict:
        d = {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("requests", "stages", "request_columns", "stage_columns", "stretch_samples")
        }
        d["window_s"] = list(self.window_s)
        if not self.intervals:
            d.pop("intervals"), d.pop("interval_basis")
        return _clean(d)


class Figures(TypedDict):
    """A Result's per-request figures: a closed loop's from its rows, an open loop's
    from its running tallies (`collect`)."""

    per_request_tok_s: float
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    tpot_ms_mean: float
    tpot_ms_p50: float
    tpot_ms_p99: float
    e2e_ms_mean: float


def _clean(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return None if not np.isfinite(v) else round(float(v), 6)
    if isinstance(v, np.integer):
        return int(v)
    return v


def inflight_groups(rec: Record) -> list[tuple[float, list[int]]]:
    """vLLM's in-flight groups at each launch of a kept record (tally.InflightGroups),
    as (launch time, sizes largest first); empty without groups or with DP ranks."""
    if rec.groups < 1 or rec.dp > 1:
        return []
    groups, out, returns, i = InflightGroups(rec.groups), [], rec.tokens, 0
    for b in rec.batches:
        while i < len(returns) and returns[i][0] <= b.launch_s:
            groups.returned(returns[i][0])
            i += 1
        out.append((b.launch_s, groups.launch(b.launch_s, b.requests, False)))
    return out


def collect(
    rec: Record,
    scenario: dict,
    wall_s: float,
    *,
    provenance_shares: dict | None = None,
    data_parallel: dict | None = None,
) -> Result:
    """The Result of a finished run from its Record, built whole: the rows' figures
    (`rec.steps`), the finished requests' (`rec.requests`: a closed loop's rows, read
    in completion order; an open loop's running figures), the throughput's confidence
    interval as the stopping rule measured it (`rec.verdict`), and what the run knows
    beside its record (the cost model's provenance shares, the DP ranks' summary)."""
    t0, t1 = rec.window_s
    span = max(t1 - t0, 1e-12)
    st, done = rec.steps, rec.requests
    rows = done.rows()
    cols = {}
    queued = rec.engine_load is not None
    wait_s = 0.0
    period_requests, shift = rec.period or (0, 0)  # a run that repeats: whole periods (steady.py)
    if rec.clients is not None:  # a closed loop: its measured requests in completion order
        out, latency_s = done.closed_loop_sample(queued)
        # its throughput's CI as the stopping rule measured it (a record built by hand
        # carries none: then from its requests)
        load = rec.engine_load if rec.engine_load is not None else rec.clients  # queued: the admitted
        ci = (
            rec.verdict[:2]
            if rec.verdict is not None
            else closed_loop_ci(load, out, latency_s, period_requests)
        )
        # more clients than admitted: the run is too short for the queue to reach its
        # steady wait, which Little's law gives exactly in mean (steady.py)
        if rec.engine_load is not None and len(out):
            wait_s = queue_wait_s(rec.clients, rec.engine_load, float(np.mean(latency_s)))
    if rows is not None:
        order = np.argsort(rows["rid"], kind="stable")
        cols = {c: rows[c][order] for c in ROW_COLUMNS}
        start_s = cols["admit_s"] - wait_s if queued else cols["arrival_s"]
        out_len, first_s, finish_s = cols["output_len"], cols["first_token_s"], cols["finish_s"]
        decode_s = finish_s - first_s
        multi = out_len > 1
        with np.errstate(divide="ignore", invalid="ignore"):
            cols["ttft_ms"] = (first_s - start_s) * 1e3
            cols["tpot_ms"] = np.where(multi, decode_s / np.clip(out_len - 1, 1, None) * 1e3, np.nan)
            cols["decode_tok_s"] = np.where(
                multi & (decode_s > 0), (out_len - 1) / np.where(decode_s > 0, decode_s, 1), np.nan
            )
        cols["e2e_ms"] = (finish_s - start_s) * 1e3
    if rec.clients is not None:  # a closed loop: every figure from its rows
        ttft, e2e = cols["ttft_ms"], cols["e2e_ms"]
        tpot = cols["tpot_ms"][~np.isnan(cols["tpot_ms"])]
        speeds = cols["decode_tok_s"][~np.isnan(cols["decode_tok_s"])]
        figures = Figures(
            per_request_tok_s=float(speeds.mean()) if len(speeds) else float("nan"),
            ttft_ms_mean=float(ttft.mean()) if len(ttft) else float("nan"),
            ttft_ms_p50=percentile(ttft, 50),
            ttft_ms_p99=percentile(ttft, 99),
            tpot_ms_mean=float(tpot.mean()) if len(tpot) else float("nan"),
            tpot_ms_p50=percentile(tpot, 50),
            tpot_ms_p99=percentile(tpot, 99),
            e2e_ms_mean=float(e2e.mean()) if len(e2e) else float("nan"),
        )
        saturation, rel_error, stretches = None, 0.0, {}
    else:  # an open loop or a trace: running figures (request_tally.py)
        assert st.token_times is not None  # an open loop's tally keeps them
        ci = st.token_times.window_ci(t0, t1)
        figures = Figures(
            per_request_tok_s=done.decode_tok_s.mean,
            ttft_ms_mean=done.ttft_ms.mean,
            ttft_ms_p50=done.ttft_ms.percentile(50),
            ttft_ms_p99=done.ttft_ms.percentile(99),
            tpot_ms_mean=done.tpot_ms.mean,
            tpot_ms_p50=done.tpot_ms.percentile(50),
            tpot_ms_p99=done.tpot_ms.percentile(99),
            e2e_ms_mean=done.e2e_ms.mean,
        )
        stretches = {} if done.stretches is None else done.stretches.samples(t0)
        sat = done.saturation()
        saturation = None if sat is None else sat.to_dict()
        # the percentiles no longer exact: each within its sketch's error
        sketched = [p.sketch.rel_error for p in (done.ttft_ms, done.tpot_ms) if p.sketch is not None]
        rel_error = max(sketched, default=0.0)

    compute = np.array(st.compute_s) / span
    comm = np.array(st.comm_s) / span
    stages = {
        "stage": np.arange(rec.pp),
        "layers": np.array(rec.layers_per_stage),
        "compute": compute,
        "allreduce": comm,
        "busy": compute + comm,
        "idle": np.maximum(0.0, 1 - compute - comm),
    }
    hops = [st.hop_s[s] / span for s in range(len(rec.hop_names))]
    occ = st.occupancy
    return Result(
        scenario=scenario,
        window_s=(t0, t1),
        output_throughput_tok_s=st.tokens / span,
        output_throughput_ci_tok_s=ci[1],
        request_throughput_req_s=done.measured / span,
        **figures,
        bubble_fraction=float(stages["idle"].mean()),
        stage_busy_fraction=[float(x) for x in stages["busy"]],
        time_shares={
            "compute": float(stages["compute"].mean()),
            "allreduce": float(stages["allreduce"].mean()),
            "idle": float(stages["idle"].mean()),
        },
        allreduce_share=float(stages["allreduce"].mean()),
        p2p_share=float(np.mean(hops)) if hops else 0.0,
        cpu_share=st.cpu_s / span / rec.dp,
        link_wait_share=st.link_wait_s / span,
        mean_requests_per_microbatch=st.batch_requests / st.batches if st.batches else 0.0,
        mean_decode_batch=st.decode_requests / st.decode_batches if st.decode_batches else 0.0,
        decode_batch_per_slot=[
            float(s / c) if c else 0.0
            for s, c in zip(slot_orbits(st.slot_decode, shift), slot_orbits(st.slot_decode_batches, shift))
        ],
        group_sizes=st.groups.means() if st.groups is not None else None,
        occupancy_by_position=None if occ is None else occ.means(t1 - t0),
        empty_share_by_position=None if occ is None else occ.empty_shares(t1 - t0),
        preemptions=st.evictions,
        preemptions_total=st.evictions_total,
        completed_requests=done.measured,
        period_requests=period_requests,
        sim_events=rec.events,
        sim_wall_s=wall_s,
        saturation=saturation,
        percentile_rel_error=rel_error,
        request_columns=cols,
        stage_columns=stages,
        stretch_samples=stretches,
        provenance_shares=dict(provenance_shares or {}),
        data_parallel=dict(data_parallel or {}),
        cpu_parts={p: st.host_s[p] / span / rec.dp for p in LOOP_PARTS},
        host_processes={p: st.host_s[p] / span for p in PROCESS_PARTS},
    )

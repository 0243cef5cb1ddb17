"""Metrics: what a run measured, derived from its `Record` once the run is over.

The measurement window is [warm-up end, stop] for a closed loop (the first C
requests are warm-up) and the whole run for open loops and traces. Busy intervals
are clipped to the window; a stage's bubble is the part of the window it was not
busy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .record import Batch, Record
from .steady import closed_loop_ci, queue_wait_s, window_ci

if TYPE_CHECKING:
    import pandas as pd
    from numpy.typing import ArrayLike

    from .batches import Request

REQUEST_COLUMNS = (
    "rid",
    "client",
    "arrival_s",
    "admit_s",
    "input_len",
    "output_len",
    "first_token_s",
    "finish_s",
    "slot",
    "ttft_ms",
    "tpot_ms",
    "decode_tok_s",
    "e2e_ms",
)
STAGE_COLUMNS = ("stage", "layers", "compute", "allreduce", "busy", "idle")

# Gaps shorter than this are float noise between touching intervals, not bubbles.
BUBBLE_MIN_S = 1e-9


# ---- interval arithmetic (one clipping rule for every metric) ----------------------


def _clipped(intervals, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of [(start, end)] clipped to [t0, t1] (empty ones keep end <= start)."""
    a = np.asarray(intervals, dtype=float).reshape(-1, 2)
    return np.maximum(a[:, 0], t0), np.minimum(a[:, 1], t1)


def busy_in(intervals: ArrayLike, t0: float, t1: float) -> float:
    """Seconds of `intervals` inside [t0, t1], overlaps counted each time (a resource
    busy twice at once, e.g. two transfers waiting, counts both)."""
    if not intervals:
        return 0.0
    start, end = _clipped(intervals, t0, t1)
    return float(np.clip(end - start, 0.0, None).sum())


def merge(intervals: ArrayLike, t0: float = -np.inf, t1: float = np.inf) -> np.ndarray:
    """The union of [(start, end)] clipped to [t0, t1], as sorted disjoint rows.
    Touching intervals merge (compute then its all-reduce is one busy stretch)."""
    start, end = _clipped(intervals, t0, t1)
    a = np.column_stack((start, end))
    a = a[a[:, 1] > a[:, 0]]
    if not len(a):
        return a
    a = a[np.argsort(a[:, 0], kind="stable")]
    reach = np.maximum.accumulate(a[:, 1])
    new = np.concatenate(([True], a[1:, 0] > reach[:-1]))
    starts = a[new, 0]
    ends = reach[np.concatenate((np.flatnonzero(new)[1:] - 1, [len(a) - 1]))]
    return np.column_stack((starts, ends))


def covered_s(intervals: ArrayLike, t0: float, t1: float) -> float:
    """Seconds of [t0, t1] covered by at least one of `intervals` (overlaps once)."""
    m = merge(intervals, t0, t1)
    return float((m[:, 1] - m[:, 0]).sum())


def gaps(busy: np.ndarray, t0: float, t1: float) -> np.ndarray:
    """Idle stretches of [t0, t1] between merged busy rows, longer than BUBBLE_MIN_S."""
    edges = np.concatenate(([t0], busy.ravel(), [t1])).reshape(-1, 2)
    return edges[edges[:, 1] - edges[:, 0] > BUBBLE_MIN_S]


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


def idle_breakdown(rec: Record, t0: float, t1: float) -> list[StageIdle]:
    """Per stage, compute / all-reduce / idle-by-cause shares of [t0, t1].

    Idle time is split by what the idle stage was waiting for: a hop into it in
    flight (P2P), the scheduler CPU at work (stage 0, where the scheduler runs), or
    neither (the pipeline bubble proper). Each part is the idle time those intervals
    cover, taken in that order, so the parts add up to the stage's idle share."""
    span = max(t1 - t0, 1e-12)
    out = []
    for s in range(rec.pp):
        busy = rec.compute[s] + rec.comm[s]
        hop = rec.hops[rec.inbound_hop(s)] if rec.hop_names else []
        cpu = rec.cpu if s == 0 else []
        covered = [
            covered_s(busy, t0, t1),
            covered_s(busy + hop, t0, t1),
            covered_s(busy + hop + cpu, t0, t1),
        ]
        idle = gaps(merge(busy, t0, t1), t0, t1)
        out.append(
            StageIdle(
                stage=s,
                compute=covered_s(rec.compute[s], t0, t1) / span,
                allreduce=covered_s(rec.comm[s], t0, t1) / span,
                idle_p2p=(covered[1] - covered[0]) / span,
                idle_cpu=(covered[2] - covered[1]) / span,
                idle_bubble=(span - covered[2]) / span,
                bubbles=len(idle),
                bubble_s=float((idle[:, 1] - idle[:, 0]).sum()),
            )
        )
    return out


def percentile(values: ArrayLike, q: float) -> float:
    """np.percentile's default (linear) rule, q in percent: the sorted values
    interpolated at (n - 1) q / 100, numpy's lerp included (_function_base_impl.py
    `_lerp`), computed directly: np.percentile calls np.unique, which imports
    numpy.ma (tens of milliseconds of a prediction)."""
    n = len(values)
    if not n:
        return float("nan")
    x = np.sort(np.asarray(values, dtype=float))
    pos = (n - 1) * (q / 100)
    lo = int(pos)
    t = pos - lo
    if lo + 1 >= n:
        return float(x[-1])
    a, b = float(x[lo]), float(x[lo + 1])
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


@dataclass
class Result:
    """One prediction. Scalars for reports; `requests` and `stages` as DataFrames,
    built on first use from numpy columns (pandas is imported only then: a prediction
    needs none)."""

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
    # running requests evicted for KV in the window (SGLang retract_decode, vLLM
    # recompute preemption; docs/engines.md §4), and in the whole run
    preemptions: int
    preemptions_total: int
    completed_requests: int
    sim_events: int
    sim_wall_s: float
    saturation: dict | None  # open loop: arrivals against service (saturation.py); closed: None
    request_columns: dict = field(repr=False)  # REQUEST_COLUMNS -> array, measured requests by rid
    stage_columns: dict = field(repr=False)  # STAGE_COLUMNS -> array, one row per stage
    # prediction intervals (pipesim.uncertainty): metric -> (lo, hi), empty unless asked for
    intervals: dict = field(default_factory=dict)
    interval_basis: dict = field(default_factory=dict)  # what each part of the band contributed
    provenance_shares: dict = field(default_factory=dict)  # share of stage time by cost provenance (costs.py)
    # data parallelism (dataparallel.py): ranks, lock step, requests per rank, dummy-step
    # share per rank; empty with one rank
    data_parallel: dict = field(default_factory=dict)

    @cached_property
    def requests(self) -> pd.DataFrame:
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
            if k not in ("requests", "stages", "request_columns", "stage_columns")
        }
        d["window_s"] = list(self.window_s)
        if not self.intervals:
            d.pop("intervals"), d.pop("interval_basis")
        return _clean(d)


def _clean(v):
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return None if not np.isfinite(v) else round(float(v), 6)
    if isinstance(v, np.integer):
        return int(v)
    return v


def _per_slot(batches: list[Batch], slots: int) -> list[float]:
    """Mean decode batch size of each slot: unequal slots are what makes a PP bubble
    at high load (one group holding most requests)."""
    sums, counts = [0.0] * slots, [0] * slots
    for b in batches:
        if b.kind == "decode" and b.slot < slots:
            sums[b.slot] += b.requests
            counts[b.slot] += 1
    return [s / c if c else 0.0 for s, c in zip(sums, counts)]


def inflight_groups(rec: Record) -> list[tuple[float, list[int]]]:
    """vLLM's in-flight groups at each launch: the requests of every batch in flight
    then (launched, not yet returned), largest first, padded with zeros to
    max_concurrent_batches. vLLM has no slots; a decoding request stays with the batch
    it was scheduled with, so these are its groups (docs/engines.md §6). Batches return
    in launch order (one pipeline), so the i-th token return is the i-th batch's."""
    n = rec.groups
    if n < 1 or rec.dp > 1:
        return []
    out, inflight = [], deque()
    for i, b in enumerate(rec.batches):
        while inflight and inflight[0][0] <= b.launch_s:
            inflight.popleft()
        inflight.append((rec.tokens[i].time_s if i < len(rec.tokens) else float("inf"), b.requests))
        sizes = sorted((size for _, size in inflight), reverse=True)[:n]
        out.append((b.launch_s, sizes + [0] * (n - len(sizes))))
    return out


def _per_group(rec: Record, t0: float, t1: float) -> list[float] | None:
    """Mean size of each in-flight group (largest first) over the launches in [t0, t1]."""
    samples = [sizes for t, sizes in inflight_groups(rec) if t0 <= t <= t1]
    if not rec.groups or rec.dp > 1:
        return None
    if not samples:
        return [0.0] * rec.groups
    return [float(x) for x in np.mean(samples, axis=0)]


def _saturation(finished: list[Request]) -> dict | None:
    from .saturation import saturation

    s = saturation(
        [r.arrival_s for r in finished], [r.first_token_s for r in finished], [r.finish_s for r in finished]
    )
    return None if s is None else s.to_dict()


def collect(rec: Record, finished: list[Request], scenario: dict, wall_s: float) -> Result:
    """The Result of a finished run from its Record and its finished requests (in
    completion order: the closed-loop confidence interval is over batches of them)."""
    t0, t1 = rec.window_s
    span = max(t1 - t0, 1e-12)

    tok = np.asarray(rec.tokens, dtype=float).reshape(-1, 2)
    in_window = (tok[:, 0] > t0) & (tok[:, 0] <= t1)
    out_tokens = float(tok[in_window, 1].sum())

    done_rows = sorted((r for r in finished if t0 < r.finish_s <= t1), key=lambda r: r.rid)
    cols = {
        c: np.array(
            [getattr(r, c) for r in done_rows],
            dtype=np.int64 if c in ("rid", "client", "input_len", "output_len", "slot") else float,
        )
        for c in REQUEST_COLUMNS[:9]
    }
    measured = [r for r in finished if r.finish_s > t0] if rec.clients is not None else []
    if rec.engine_load is not None:
        # more clients than admitted: the run is too short for the queue to reach its
        # steady wait, which Little's law gives exactly in mean (steady.py)
        admitted_s = [r.finish_s - r.admit_s for r in measured]
        ci = closed_loop_ci(rec.engine_load, [r.output_len for r in measured], admitted_s)
        wait_s = queue_wait_s(rec.clients, rec.engine_load, float(np.mean(admitted_s))) if admitted_s else 0.0
        start_s = cols["admit_s"] - wait_s
    else:
        start_s = cols["arrival_s"]
        if rec.clients is not None:
            ci = closed_loop_ci(
                rec.clients, [r.output_len for r in measured], [r.finish_s - r.arrival_s for r in measured]
            )
        else:
            ci = window_ci(rec.tokens, t0, t1)
    out_len, first_s, finish_s = cols["output_len"], cols["first_token_s"], cols["finish_s"]
    decode_s = finish_s - first_s
    multi = out_len > 1
    with np.errstate(divide="ignore", invalid="ignore"):
        cols["ttft_ms"] = ttft = (first_s - start_s) * 1e3
        cols["tpot_ms"] = np.where(multi, decode_s / np.clip(out_len - 1, 1, None) * 1e3, np.nan)
        cols["decode_tok_s"] = np.where(
            multi & (decode_s > 0), (out_len - 1) / np.where(decode_s > 0, decode_s, 1), np.nan
        )
    cols["e2e_ms"] = e2e = (finish_s - start_s) * 1e3
    tpot = cols["tpot_ms"][~np.isnan(cols["tpot_ms"])]
    speeds = cols["decode_tok_s"][~np.isnan(cols["decode_tok_s"])]
    n_done = len(done_rows)

    stage_rows = []
    for s in range(rec.pp):
        c, a = busy_in(rec.compute[s], t0, t1) / span, busy_in(rec.comm[s], t0, t1) / span
        stage_rows.append((s, rec.layers_per_stage[s], c, a, c + a, max(0.0, 1 - c - a)))
    stages = {name: np.array([row[i] for row in stage_rows]) for i, name in enumerate(STAGE_COLUMNS)}
    hops = [busy_in(v, t0, t1) / span for v in rec.hops.values()]
    batches = [b for b in rec.batches if t0 <= b.launch_s <= t1]
    decode_sizes = [b.requests for b in batches if b.kind == "decode"]
    return Result(
        scenario=scenario,
        window_s=(t0, t1),
        output_throughput_tok_s=out_tokens / span,
        output_throughput_ci_tok_s=ci[1],
        request_throughput_req_s=n_done / span,
        per_request_tok_s=float(speeds.mean()) if len(speeds) else float("nan"),
        ttft_ms_mean=float(ttft.mean()) if len(ttft) else float("nan"),
        ttft_ms_p50=percentile(ttft, 50),
        ttft_ms_p99=percentile(ttft, 99),
        tpot_ms_mean=float(tpot.mean()) if len(tpot) else float("nan"),
        tpot_ms_p50=percentile(tpot, 50),
        tpot_ms_p99=percentile(tpot, 99),
        e2e_ms_mean=float(e2e.mean()) if n_done else float("nan"),
        bubble_fraction=float(stages["idle"].mean()),
        stage_busy_fraction=[float(x) for x in stages["busy"]],
        time_shares={
            "compute": float(stages["compute"].mean()),
            "allreduce": float(stages["allreduce"].mean()),
            "idle": float(stages["idle"].mean()),
        },
        allreduce_share=float(stages["allreduce"].mean()),
        p2p_share=float(np.mean(hops)) if hops else 0.0,
        cpu_share=busy_in(rec.cpu, t0, t1) / span,
        link_wait_share=busy_in(rec.link_wait, t0, t1) / span,
        mean_requests_per_microbatch=float(np.mean([b.requests for b in batches])) if batches else 0.0,
        mean_decode_batch=float(np.mean(decode_sizes)) if decode_sizes else 0.0,
        decode_batch_per_slot=_per_slot(batches, rec.slots),
        group_sizes=_per_group(rec, t0, t1),
        preemptions=sum(1 for t, _ in rec.evictions if t0 < t <= t1),
        preemptions_total=len(rec.evictions),
        completed_requests=n_done,
        sim_events=rec.events,
        sim_wall_s=wall_s,
        saturation=_saturation(finished) if rec.clients is None else None,
        request_columns=cols,
        stage_columns=stages,
    )

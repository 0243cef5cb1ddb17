"""Metrics: what a run measured, derived from the recorder once the run is over.

The measurement window is [warm-up end, stop] for a closed loop (the first C
requests are warm-up) and the whole run for open loops and traces. Busy intervals
are clipped to the window; a stage's bubble is the part of the window it was not
busy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .steady import window_ci


def busy_in(intervals, t0: float, t1: float) -> float:
    """Seconds of `intervals` ([(start, end)]) inside [t0, t1]."""
    if not intervals:
        return 0.0
    a = np.asarray(intervals, dtype=float)
    return float(np.clip(np.minimum(a[:, 1], t1) - np.maximum(a[:, 0], t0), 0.0, None).sum())


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


@dataclass
class Result:
    """One prediction. Scalars for reports; `requests` and `stages` as DataFrames."""

    scenario: dict
    window_s: tuple[float, float]
    output_throughput_tok_s: float
    output_throughput_ci_tok_s: float     # 95% half-width (batch means)
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
    link_wait_share: float                # share of the window some transfer waited for a busy PCIe link
    mean_requests_per_microbatch: float
    mean_decode_batch: float
    decode_batch_per_slot: list           # mean decode batch of each micro-batch slot (0: unused)
    completed_requests: int
    sim_events: int
    sim_wall_s: float
    requests: pd.DataFrame = field(repr=False)
    stages: pd.DataFrame = field(repr=False)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("requests", "stages")}
        d["window_s"] = list(self.window_s)
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


def _per_slot(batches, slots: int) -> list:
    """Mean decode batch size of each slot: unequal slots are what makes a PP bubble
    at high load (one group holding most requests)."""
    sums, counts = [0.0] * slots, [0] * slots
    for _, slot, size, kind in batches:
        if kind == "decode" and slot < slots:
            sums[slot] += size
            counts[slot] += 1
    return [s / c if c else 0.0 for s, c in zip(sums, counts)]


def collect(sim, scenario: dict, wall_s: float) -> Result:
    rec, env = sim.rec, sim.env
    t1 = env.now
    t0 = sim.warmup_end_s if sim.workload.kind == "closed" else 0.0
    span = max(t1 - t0, 1e-12)

    tok = np.asarray(rec.tokens, dtype=float).reshape(-1, 2)
    in_window = (tok[:, 0] > t0) & (tok[:, 0] <= t1)
    out_tokens = float(tok[in_window, 1].sum())

    rows = [(r.rid, r.client, r.arrival_s, r.input_len, r.output_len, r.first_token_s, r.finish_s, r.slot)
            for r in sim.requests]
    req = pd.DataFrame(rows, columns=["rid", "client", "arrival_s", "input_len", "output_len",
                                      "first_token_s", "finish_s", "slot"])
    done = req[(req.finish_s > t0) & (req.finish_s <= t1)].copy()
    done["ttft_ms"] = (done.first_token_s - done.arrival_s) * 1e3
    decode_s = done.finish_s - done.first_token_s
    multi = done.output_len > 1
    done["tpot_ms"] = np.where(multi, decode_s / (done.output_len - 1).clip(lower=1) * 1e3, np.nan)
    done["decode_tok_s"] = np.where(multi & (decode_s > 0), (done.output_len - 1) / decode_s.where(decode_s > 0, 1), np.nan)
    done["e2e_ms"] = (done.finish_s - done.arrival_s) * 1e3
    tpot = done.tpot_ms.dropna().to_numpy()
    ttft = done.ttft_ms.to_numpy()

    stage_rows = []
    for s in range(sim.pp):
        c, a = busy_in(rec.compute[s], t0, t1) / span, busy_in(rec.comm[s], t0, t1) / span
        stage_rows.append((s, sim.costs.plan.layers_per_stage[s], c, a, c + a, max(0.0, 1 - c - a)))
    stages = pd.DataFrame(stage_rows, columns=["stage", "layers", "compute", "allreduce", "busy", "idle"])
    hops = [busy_in(v, t0, t1) / span for v in rec.hops.values()]
    batches = [b for b in rec.batches if t0 <= b[0] <= t1]
    decode_sizes = [b[2] for b in batches if b[3] == "decode"]
    return Result(
        scenario=scenario,
        window_s=(t0, t1),
        output_throughput_tok_s=out_tokens / span,
        output_throughput_ci_tok_s=(sim.throughput_ci() if sim.workload.kind == "closed"
                                    else window_ci(rec.tokens, t0, t1))[1],
        request_throughput_req_s=len(done) / span,
        per_request_tok_s=float(done.decode_tok_s.mean()) if len(done) else float("nan"),
        ttft_ms_mean=float(ttft.mean()) if len(ttft) else float("nan"),
        ttft_ms_p50=_pct(ttft, 50), ttft_ms_p99=_pct(ttft, 99),
        tpot_ms_mean=float(tpot.mean()) if len(tpot) else float("nan"),
        tpot_ms_p50=_pct(tpot, 50), tpot_ms_p99=_pct(tpot, 99),
        e2e_ms_mean=float(done.e2e_ms.mean()) if len(done) else float("nan"),
        bubble_fraction=float(stages.idle.mean()),
        stage_busy_fraction=[float(x) for x in stages.busy],
        time_shares={"compute": float(stages.compute.mean()), "allreduce": float(stages.allreduce.mean()),
                     "idle": float(stages.idle.mean())},
        allreduce_share=float(stages.allreduce.mean()),
        p2p_share=float(np.mean(hops)) if hops else 0.0,
        cpu_share=busy_in(rec.cpu, t0, t1) / span,
        link_wait_share=busy_in(rec.link_wait, t0, t1) / span,
        mean_requests_per_microbatch=float(np.mean([b[2] for b in batches])) if batches else 0.0,
        mean_decode_batch=float(np.mean(decode_sizes)) if decode_sizes else 0.0,
        decode_batch_per_slot=_per_slot(batches, getattr(sim.settings, "slots", 1)),
        completed_requests=int(len(done)),
        sim_events=int(next(env._eid)),  # SimPy numbers every scheduled event
        sim_wall_s=wall_s,
        requests=done.reset_index(drop=True),
        stages=stages,
    )

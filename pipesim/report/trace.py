"""The timeline of one run: a Chrome trace event file for Perfetto, built from the
run's `Record` and `Result`.

The trace has one track per GPU (each TP rank of a stage runs the stage's slices in
lock-step, so its ranks show identical slices), one per PP hop and one for the
scheduler CPU. Compute, TP collectives, hops and scheduling are complete ("X")
slices; a bubble is a gap on a GPU track. Times are written in whole nanoseconds
(ts and dur are microseconds with three decimals) so that slices that touch in the
simulation touch in the file, never overlap.

Counter tracks show each slot's occupancy (vLLM: each in-flight group's), the slots
occupied by position (the micro-batches in flight, fullest first: how many, and each
one's requests; measure/occupancy.py) and the free KV cache over time; an instant
marks each request evicted for KV (`counters`).
The file's metadata carries each stage's idle time split by cause
(`metrics.idle_breakdown`).
"""

from __future__ import annotations

from pathlib import Path

from ..base.files import json_text, jsonable
from ..measure.metrics import Result, idle_breakdown, inflight_groups
from ..measure.occupancy import occupancy_steps, ordinal
from ..measure.record import Record
from ..measure.rows import PROCESS_PARTS

TRACK_GPUS, TRACK_HOPS, TRACK_CPU, TRACK_WINDOW = 1, 2, 3, 4


# ---- the Chrome trace ------------------------------------------------------------------


def _ns(t_s: float) -> int:
    return int(round(t_s * 1e9))


def _slice(
    name: str, cat: str, start_s: float, end_s: float, pid: int, tid: int, args: dict | None = None
) -> dict:
    a, b = _ns(start_s), _ns(end_s)
    ev = {"name": name, "cat": cat, "ph": "X", "ts": a / 1e3, "dur": (b - a) / 1e3, "pid": pid, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def _meta(kind: str, pid: int, tid: int, value: str | int) -> dict:
    key = "name" if kind.endswith("_name") else "sort_index"
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def flows(rec: Record) -> dict[tuple[int, int, int], dict]:
    """Flow arrows in the trace event format's version 2 (the form Perfetto's JSON
    importer reads as bound to slices, src/trace_processor/importers/json/
    json_trace_parser_impl.cc MaybeAddFlow): each micro-batch's slices in order, its
    compute on stage 0 (TP rank 0's track), the hop out, stage 1's compute, ... the
    last stage's compute and the hop that returns its tokens, carry the micro-batch's
    number as "bind_id", the first "flow_out", the last "flow_in", each between both.
    Returned as (pid, tid, interval index) -> the fields that slice gets."""
    out: dict[tuple[int, int, int], dict] = {}
    hops = [rec.hops[name] for name in rec.hop_names]
    n = min([len(c) for c in rec.compute] + [len(h) for h in hops])
    points = []
    for s in range(rec.pp):
        points += [(TRACK_GPUS, rec.stage_gpus[s][0]), (TRACK_HOPS, s)]
    for k, (pid, tid) in enumerate(points):
        role = {"flow_in": True} if k else {}
        if k < len(points) - 1:
            role["flow_out"] = True
        for i in range(n):
            out[(pid, tid, i)] = {"bind_id": i, **role}
    return out


def _counter(name: str, t_s: float, args: dict) -> dict:
    return {
        "name": name,
        "cat": "counter",
        "ph": "C",
        "ts": _ns(t_s) / 1e3,
        "pid": TRACK_CPU,
        "tid": 0,
        "args": args,
    }


def counters(rec: Record, engine: str) -> list[dict]:
    """Counter tracks ("ph": "C") on the scheduler process: each micro-batch slot's
    occupancy (SGLang: requests in the slot's latest batch; vLLM: the batches in flight
    at each launch, largest first, `metrics.inflight_groups`), the free KV-cache
    tokens after each batch was formed, and an instant event per request the engine
    evicted for KV (SGLang retract_decode, vLLM preemption; docs/engines.md §4)."""
    groups = inflight_groups(rec) if rec.groups > 1 else []
    if groups:  # vLLM: the batches in flight at each launch, largest first
        n = rec.groups
        out = [_counter(f"group {k} occupancy", 0.0, {"requests": 0}) for k in range(n)]
        for t, sizes in groups:
            out += [_counter(f"group {k} occupancy", t, {"requests": v}) for k, v in enumerate(sizes)]
    else:
        out = [_counter(f"slot {k} occupancy", 0.0, {"requests": 0}) for k in range(rec.slots)]
        out += [
            _counter(f"slot {b.slot} occupancy", b.launch_s, {"requests": b.requests}) for b in rec.batches
        ]
    out += positions(rec, "slots" if engine == "sglang" else "groups")
    out += [_counter("KV cache", t, {"free tokens": free}) for t, free in rec.kv_free]
    what = "retract" if engine == "sglang" else "preempt"
    out += [
        {
            "name": what,
            "cat": "kv",
            "ph": "i",
            "s": "p",
            "ts": _ns(t) / 1e3,
            "pid": TRACK_CPU,
            "tid": 0,
            "args": {"rid": rid},
        }
        for t, rid in rec.evictions
    ]
    return out


def positions(rec: Record, what: str) -> list[dict]:
    """Two counter tracks of the micro-batches in flight at every launch and return
    (measure/occupancy.py; none with DP ranks): "<what> occupied", how many hold a
    batch, and "requests by <slot> position", the requests of each, fullest first
    (one series per position: 1st, 2nd, ...). Their time-weighted means over the window
    are the Result's positions."""
    occ = rec.steps.occupancy
    if occ is None:
        return []
    n, by = occ.positions, f"requests by {what[:-1]} position"
    names = [ordinal(k) for k in range(1, n + 1)]
    out = [
        _counter(f"{what} occupied", 0.0, {"batches in flight": 0}),
        _counter(by, 0.0, dict.fromkeys(names, 0)),
    ]
    for t, sizes in occupancy_steps(rec.batches, rec.tokens, n):
        out.append(_counter(f"{what} occupied", t, {"batches in flight": sum(1 for v in sizes if v)}))
        out.append(_counter(by, t, dict(zip(names, sizes))))
    return out


def build_trace(rec: Record, result: Result) -> dict:
    """The trace event JSON object of a finished run (see the module docstring): a
    record that kept its rows (runner.simulate's record="full")."""
    if not rec.kept:
        raise ValueError("a trace draws every row: simulate the run with record='full'")
    t0, t1 = result.window_s
    sc = result.scenario
    batches = rec.batches
    events: list[dict] = [
        _meta(
            "process_name",
            TRACK_GPUS,
            0,
            f"GPUs (DP{rec.dp} x TP{rec.tp}, {sc['model']})"
            if rec.dp > 1
            else f"GPUs (TP{rec.tp} x PP{rec.pp}, {sc['model']})",
        ),
        _meta("process_sort_index", TRACK_GPUS, 0, TRACK_GPUS),
        _meta("process_name", TRACK_HOPS, 0, "PP hops (PCIe)"),
        _meta("process_sort_index", TRACK_HOPS, 0, TRACK_HOPS),
        _meta("process_name", TRACK_CPU, 0, "Scheduler CPU"),
        _meta("process_sort_index", TRACK_CPU, 0, TRACK_CPU),
        _meta("thread_name", TRACK_CPU, 0, "scheduler (stage 0)"),
        _meta("process_name", TRACK_WINDOW, 0, "Measurement window"),
        _meta("process_sort_index", TRACK_WINDOW, 0, TRACK_WINDOW),
        _meta("thread_name", TRACK_WINDOW, 0, "measured"),
    ]

    def batch_args(i: int, stage: int) -> dict:
        # Stages and hops serve micro-batches first come first served, so the i-th
        # interval of every stage and hop is the i-th micro-batch launched. DP ranks
        # (rows of a dp > 1 record) each run their own batches: no such order.
        if rec.dp > 1:
            return {"dp_rank": stage}
        d: dict[str, int | str] = {"micro_batch": i, "stage": stage}
        if i < len(batches):
            b = batches[i]
            d.update(slot=b.slot, requests=b.requests, kind=b.kind)
        return d

    bound = flows(rec) if rec.hop_names else {}  # PP hops: none with one stage, nor between DP ranks
    for s in range(rec.pp):
        layers = rec.layers_per_stage[s]
        for rank, gpu in enumerate(rec.stage_gpus[s]):
            events.append(
                _meta(
                    "thread_name",
                    TRACK_GPUS,
                    gpu,
                    f"GPU {gpu}: {'DP rank' if rec.dp > 1 else 'stage'} {s}, TP rank {rank} ({layers} layers)",
                )
            )
            events.append(_meta("thread_sort_index", TRACK_GPUS, gpu, gpu))
            for i, (a, b) in enumerate(rec.compute[s]):
                args = batch_args(i, s)
                events.append(
                    _slice(
                        f"{args.get('kind', 'compute')} x{args.get('requests', '?')}",
                        "compute",
                        a,
                        b,
                        TRACK_GPUS,
                        gpu,
                        args,
                    )
                    | bound.get((TRACK_GPUS, gpu, i), {})
                )
            for i, (a, b) in enumerate(rec.comm[s]):
                events.append(_slice("all-reduce", "allreduce", a, b, TRACK_GPUS, gpu, batch_args(i, s)))
    if rec.hop_names:  # PP hops (none with one stage, nor between DP ranks)
        for s, name in enumerate(rec.hop_names):
            dst = (s + 1) % rec.pp
            src_g, dst_g = rec.stage_gpus[s], rec.stage_gpus[dst]
            label = (
                f"hop {name} (GPU {src_g[0]}-{src_g[-1]} -> GPU {dst_g[0]}-{dst_g[-1]})"
                if rec.tp > 1
                else f"hop {name} (GPU {src_g[0]} -> GPU {dst_g[0]})"
            )
            events.append(_meta("thread_name", TRACK_HOPS, s, label))
            events.append(_meta("thread_sort_index", TRACK_HOPS, s, s))
            what = "tokens" if dst == 0 else "activations"
            for i, (a, b) in enumerate(rec.hops[name]):
                events.append(
                    _slice(f"P2P {what}", "p2p", a, b, TRACK_HOPS, s, batch_args(i, s))
                    | bound.get((TRACK_HOPS, s, i), {})
                )
    # the engine loop's CPU by part on one track, the host's other processes on theirs
    # (measure/rows.py HOST_PARTS); a record built without parts shows its CPU rows
    parts = {p: rows for p, rows in rec.host.items() if rows} if rec.host else {"schedule": rec.cpu}
    for part, rows in parts.items():
        tid = 1 + PROCESS_PARTS.index(part) if part in PROCESS_PARTS else 0
        if tid:
            events.append(_meta("thread_name", TRACK_CPU, tid, part.replace("_", " ")))
        for a, b in rows:
            events.append(_slice(part.replace("_", " "), "cpu", a, b, TRACK_CPU, tid))
    events += counters(rec, sc["engine"]["engine"])
    events.append(
        _slice(
            "measurement window",
            "window",
            t0,
            t1,
            TRACK_WINDOW,
            0,
            {
                "output_tok_s": round(result.output_throughput_tok_s, 3),
                "completed_requests": result.completed_requests,
            },
        )
    )

    stages = idle_breakdown(rec)
    meta = {
        "generator": "pipesim",
        "scenario": sc,
        "window_ms": [t0 * 1e3, t1 * 1e3],
        "run_ms": rec.end_s * 1e3,
        "output_throughput_tok_s": result.output_throughput_tok_s,
        "bubble_fraction": result.bubble_fraction,
        "occupancy_by_position": result.occupancy_by_position,
        "empty_share_by_position": result.empty_share_by_position,
        "bubbles_note": (
            "bubbles are the idle stretches of each stage's GPUs inside the measurement window; "
            "idle time is split into waiting on a P2P hop, on the scheduler CPU, and the pipeline "
            "bubble proper"
        ),
        "stages": [
            {
                "stage": st.stage,
                "gpus": list(rec.stage_gpus[st.stage]),
                "layers": rec.layers_per_stage[st.stage],
                "bubbles": st.bubbles,
                "bubble_ms": st.bubble_s * 1e3,
                "compute_share": st.compute,
                "allreduce_share": st.allreduce,
                "idle_share": st.idle_p2p + st.idle_cpu + st.idle_bubble,
                "idle_p2p_share": st.idle_p2p,
                "idle_cpu_share": st.idle_cpu,
                "idle_bubble_share": st.idle_bubble,
            }
            for st in stages
        ],
    }
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": jsonable(meta)}


def write_trace(path: str | Path, trace_obj: dict) -> None:
    """Write the trace JSON atomically (a reader never sees half a file)."""
    from ..base.files import check_out_path
    from ..base.writes import write_atomic

    out = check_out_path(path, (".json",), "trace")
    write_atomic(out, lambda tmp: tmp.write_text(json_text(trace_obj, separators=(",", ":"))))

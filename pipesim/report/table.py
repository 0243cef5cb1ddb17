"""Reports: the short human table and the machine-readable JSON of a `Result`."""

from __future__ import annotations

from collections.abc import Callable

from ..base.files import json_text
from ..measure.metrics import Result
from ..measure.occupancy import ordinal
from .uncertainty import likely


def to_json(result: Result) -> str:
    return json_text(result.to_dict(), indent=2)


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:,.1f} ms"


def _positions(r: Result, engine: str) -> list[str]:
    """The micro-batches in flight by position, fullest first (measure/occupancy.py):
    each position's mean requests and share of time empty, positions that read the same
    merged ('3rd-8th'), and a line that says what they mean. None with one position."""
    means, empty = r.occupancy_by_position, r.empty_share_by_position
    if not means or len(means) < 2:
        return []
    assert empty is not None  # kept with occupancy_by_position
    cells: list[tuple[str, str, str]] = []  # (positions, mean requests, time empty)
    for k, (m, e) in enumerate(zip(means, empty), start=1):
        mean, share = f"{m:.1f}", f"{e:.0%}"
        if cells and cells[-1][1:] == (mean, share):
            first = cells[-1][0].split("-")[0]
            cells[-1] = (f"{first}-{ordinal(k)}", mean, share)
        else:
            cells.append((ordinal(k), mean, share))
    width = max(6, *(len(c[0]) for c in cells))
    what = "slots" if engine == "sglang" else "groups"
    n = len(means)
    held = sum(1 - e for e in empty)  # mean batches in flight
    never = [e for e in empty if e > 0.995]
    full = [m for m, e in zip(means, empty) if e < 0.005]
    if never:
        meaning = (
            f"{len(never)} {'never' if min(never) == 1 else 'almost never'} do: the pipeline cannot fill"
        )
    elif held < n - 0.05:
        meaning = "some are empty part of the time: the pipeline runs short of batches then"
    elif full and max(full) > 1.5 * min(full):
        meaning = "unequal batches: the fullest sets the pace"
    else:
        meaning = "the pipeline is full"
    return [
        f"  {what + ' by position':<18}"
        + "".join(f"{c[0]:>{width + 2}}" for c in cells)
        + "   (micro-batches in flight, fullest first, over the window)",
        "    mean requests   " + "".join(f"{c[1]:>{width + 2}}" for c in cells),
        "    time empty      " + "".join(f"{c[2]:>{width + 2}}" for c in cells),
        f"    {held:.1f} of {n} {what} have a batch in flight on average; {meaning}",
    ]


def _periods(r: Result) -> str:
    """Where a run that repeats got its CI: whole periods (steady.py)."""
    p = r.period_requests
    if not p:
        return ""
    return f", {r.completed_requests // p} whole periods of {p}: the run repeats, its CI is float rounding"


def _evicted(engine: str) -> str:
    """What the engine calls evicting a running request for KV (docs/engines.md §4)."""
    return "retractions" if engine == "sglang" else "preemptions"


_SHORT = {"user": "user", "profile deployment": "profile", "engine default": "default"}


def _sources(sources: dict) -> Callable[[str], str]:
    """A formatter: ' [user]' / ' [profile]' / ' [default]' after a knob's value."""
    return lambda knob: f" [{_SHORT[sources[knob]]}]" if knob in sources else ""


def _likely_pair(r: Result, stem: str) -> str:
    """'   (likely 1,547-2,419 / 1,633-2,777 ms)' for a p50 / p99 pair with intervals."""
    iv = r.intervals
    if f"{stem}_p50" not in iv or f"{stem}_p99" not in iv:
        return ""
    (a, b), (c, d) = iv[f"{stem}_p50"], iv[f"{stem}_p99"]
    return "" if a != a or c != c else f"   (likely {a:,.0f}-{b:,.0f} / {c:,.0f}-{d:,.0f} ms)"


def table(result: Result) -> str:
    r, sc = result, result.scenario
    eng = sc["engine"]
    w = sc["workload"]
    load = (
        f"C={w['concurrency']} closed loop"
        if w["kind"] == "closed"
        else f"{w['rate_rps']} req/s Poisson"
        if w["kind"] == "poisson"
        else f"trace {w['trace']}"
    )
    gen = eng.get("host", {}).get("generation")
    version = (f" {sc['engine_version']}" if sc.get("engine_version") else "") + (f" ({gen})" if gen else "")
    lines = [
        f"pipesim  {sc['model']} on {sc['box']} ({sc['profile']})",
        f"  TP{sc['tp']} x PP{sc['pp']}{_parallel(sc)}  layers {','.join(map(str, sc['layers_per_stage']))}  "
        f"{eng['engine']}{version}  {load}  in/out {w.get('input_len', '-')}/{w.get('output_len', '-')} tokens",
    ]
    src = _sources(sc.get("knob_sources", {}))
    if eng["engine"] == "sglang":
        lines.append(
            f"  max_running_requests {eng['max_running_requests']}{src('max_running_requests')}  "
            f"per-slot cap {eng['pp_max_micro_batch_size']}{src('pp_max_micro_batch_size')}  "
            f"slots {eng['slots']} (async depth {eng['pp_async_batch_depth']}{src('pp_async_batch_depth')})  "
            f"mem_fraction_static {eng['mem_fraction_static']:g}{src('mem_fraction_static')}  "
            f"KV {sc['kv_cache_tokens']:,} tokens"
        )
    else:
        lines.append(
            f"  max_num_seqs {eng['max_num_seqs']}{src('max_num_seqs')}  "
            f"batches in flight {eng['max_concurrent_batches']}  "
            f"gpu_memory_utilization {eng['gpu_memory_utilization']:g}{src('gpu_memory_utilization')}  "
            f"KV {sc['kv_cache_tokens']:,} tokens"
        )
    if sc.get("kv_reservation"):
        lines.append(_memory_line(sc["kv_reservation"]))
    sh = r.time_shares
    lines += [
        "",
        f"  output throughput     {r.output_throughput_tok_s:10,.1f} tok/s   "
        f"(95% CI +/- {r.output_throughput_ci_tok_s:,.1f}; {r.request_throughput_req_s:.2f} req/s)"
        + likely(r, "output_throughput_tok_s"),
        (
            f"  per-request decode    {r.per_request_tok_s:10,.1f} tok/s"
            + likely(r, "per_request_tok_s", "{:,.1f}")
            if r.per_request_tok_s == r.per_request_tok_s
            else "  per-request decode             - (not defined: no measured request produced a second token)"
        ),
        f"  TTFT   p50 / p99      {_ms(r.ttft_ms_p50):>12} / {_ms(r.ttft_ms_p99)}"
        + _likely_pair(r, "ttft_ms"),
        f"  TPOT   p50 / p99      {_ms(r.tpot_ms_p50):>12} / {_ms(r.tpot_ms_p99)}"
        + _likely_pair(r, "tpot_ms"),
        *(
            [
                f"  (TTFT and TPOT percentiles within {r.percentile_rel_error:.1%}: more requests than "
                "pipesim keeps values of, taken by a quantile sketch, pipesim/sketch.py)"
            ]
            if r.percentile_rel_error
            else []
        ),
        *([f"  load                  {r.saturation['text']}"] if r.saturation else []),
        f"  requests/micro-batch  {r.mean_requests_per_microbatch:10.1f}   (decode batches: {r.mean_decode_batch:.1f})"
        f"   KV {_evicted(eng['engine'])} {r.preemptions} ({r.preemptions_total} in the run)",
        "",
        f"  GPU time: compute {sh['compute']:.0%}  all-reduce {sh['allreduce']:.0%}  idle (bubble) {sh['idle']:.0%};"
        f"  P2P links busy {r.p2p_share:.0%}",
        *_host(r),
        ("  DP rank busy: " if r.data_parallel else "  stage busy: ")
        + "  ".join(
            f"{'r' if r.data_parallel else 's'}{i} {b:.0%}" for i, b in enumerate(r.stage_busy_fraction)
        ),
    ]
    if r.data_parallel:
        dp = r.data_parallel
        lines.append(
            f"  DP{dp['ranks']} {'in lock step (MoE layers shared)' if dp['lock_step'] else 'independent replicas'}: "
            f"requests per rank {'/'.join(map(str, dp['requests_per_rank']))}"
            + (
                "; dummy batches "
                + "  ".join(f"r{i} {x:.0%}" for i, x in enumerate(dp["dummy_step_share"]))
                + " of steps"
                if dp["lock_step"]
                else ""
            )
        )
    lines += _positions(r, eng["engine"])
    if r.intervals:
        lines.append(
            f"  likely = {r.interval_basis['coverage']:.0%} band; calibration: {r.interval_basis['calibration']}"
        )
        lines += _unchecked(r.interval_basis)
        lines += _correction(r.interval_basis)
    else:
        lines.append(
            "  no band (intervals off): the simulation's own figures, not corrected (docs/uncertainty.md)"
        )
    if r.provenance_shares:
        lines.append(
            "  costs: "
            + "  ".join(f"{k} {v:.0%}" for k, v in r.provenance_shares.items() if v > 0)
            + "   (share of stage time by provenance)"
        )
    for table_name, source in sc.get("table_sources", {}).items():
        lines.append(f"  table {table_name}: {source}")
    lines += [
        f"  ({r.completed_requests} requests measured{_periods(r)}; {r.sim_events:,} events in {r.sim_wall_s:.2f} s)",
    ]
    return "\n".join(lines)


def _unchecked(basis: dict) -> list[str]:
    """The line that says which features of the answer no measurement has checked and
    how much wider the band is for them (report/unchecked.py); none when all are."""
    features = basis.get("unchecked") or []
    if not features:
        return []
    names = ", ".join(u["feature"] for u in features)
    return [
        f"  unchecked: {names}: no measurement behind the band has them; "
        f"+{basis['unchecked_rel']:.0%} each, in quadrature"
    ]


def _correction(basis: dict) -> list[str]:
    """The line that says the headline figures are corrected, by how much and from what
    (uncertainty.corrected); none when nothing is."""
    f, raw = basis.get("correction", {}), basis.get("uncorrected", {})
    if not f or all(v == 1.0 for v in f.values()):
        return []
    simulated = (
        f"{raw['output_throughput_tok_s']:,.1f} tok/s, TTFT p50 {_ms(raw['ttft_ms_p50'])}, "
        f"TPOT p50 {_ms(raw['tpot_ms_p50'])}"
    )
    return [
        f"  corrected: throughput x{f['throughput']:.3g}, TTFT x{f['ttft']:.3g}, TPOT x{f['tpot']:.3g} "
        f"(the corpus residuals' median for the {basis['unmeasured_share']:.0%} of stage time priced by the "
        f"roofline or borrowed; simulated {simulated})"
    ]


def _memory_line(kv: dict) -> str:
    """'  memory per GPU (stage 7): 95.6 GiB x 0.848 = 81.1 - weights 75.3 - ... = KV 4.5 GiB':
    how the engine sized its KV pool on the GPUs that bind it (engines/reserve.py)."""
    held = "".join(f" - {what} {gib:.2f}" for what, gib in kv["held_gib"].items())
    cap = f", capped at --max-total-tokens {kv['max_total_tokens']:,}" if "max_total_tokens" in kv else ""
    return (
        f"  memory per GPU (stage {kv['stage']}): {kv['gpu_memory_gib']:.1f} GiB x {kv['fraction']:g} = "
        f"{kv['budget_gib']:.1f} - weights {kv['weights_gib']:.1f}{held} = KV {kv['kv_gib']:.2f} GiB{cap}"
    )


def _parallel(sc: dict) -> str:
    """' x DP2-attn x EP8 (attention TP 4, experts split 1 way, 8 GPUs)' for a data or
    expert parallel plan; '' for TP x PP alone (docs/parallel.md)."""
    if "ep" not in sc:
        return ""
    dp = f" x DP{sc['dp']}" + ("-attn" if sc["dp_attention"] else "") if sc["dp"] > 1 else ""
    ep = f" x EP{sc['ep']}" if sc["ep"] > 1 else ""
    a2a = ", all-to-all" if sc.get("moe_a2a") == "alltoall" else ""
    return f"{dp}{ep} (attention TP {sc['attn_tp']}, experts split {sc['moe_tp']} way(s){a2a}, {sc['gpus']} GPUs)"


_PARTS = {
    "scheduler": "scheduler",
    "input_prep": "input prep",
    "broadcast": "broadcast",
    "output_step": "output processing",
    "launch": "launch",
    "detokenizer": "detokenizer",
    "api_stream": "API streaming",
    "front_end": "front end",
    "kernel_launch": "first stage's kernel launches",
}


def _host(r: Result) -> list[str]:
    """The host loop's line (docs/host-loop.md §6): the engine loop's busy share by part,
    what hides it, and the other host processes' busy shares (each its own process)."""
    if not r.cpu_parts:
        return []
    host = r.scenario.get("engine", {}).get("host", {})
    how = (
        "overlapped with the GPU"
        if host.get("overlap")
        else "async output"
        if host.get("async_output")
        else "in series with the GPU"
    )
    loop = " + ".join(f"{_PARTS[k]} {v:.0%}" for k, v in r.cpu_parts.items() if v >= 0.005) or "0%"
    other = ", ".join(f"{_PARTS[k]} {v:.0%}" for k, v in r.host_processes.items() if v >= 0.005)
    return [
        f"  host CPU: engine loop {r.cpu_share:.0%} ({how}) = {loop}"
        + (f";  own processes: {other}" if other else "")
    ]

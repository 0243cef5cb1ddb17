"""Live calibration: measure a model's operation costs on the NVIDIA GPUs of this machine.

`pipesim calibrate live --model M --out DIR` times, for the model's own shapes, every
operation the cost model looks up (GEMMs, GQA / MLA attention, the MoE layer), the
collectives between the visible GPUs, and the CPU cost of a decode loop, and writes a
profile that `pipesim predict --profile DIR --model M` uses as is.

The work is split so that everything but the timing runs without a GPU (and is tested
so): `specs.plan_specs` says what to measure, the harness (`timing`, `kernels`, `cpu`,
`hf`, `comm`) turns each `Spec` into a `Record` (shape, milliseconds), and `tables`
turns records into the profile's tables and metadata. torch, transformers and tqdm
are imported inside functions only: `import pipesim` never needs them. Where an
operation has two implementations (decode attention: torch SDPA and split-KV), both
are timed and the faster kept, as an engine picks its fastest backend.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from ...base.errors import UserError
from ...inputs.model import Model, load_model, read_hf_config
from ...profiles.tables import TABLE_COLUMNS, sig6
from .comm import link_summary, measure_comm
from .cpu import graph_loop_floor_ms, plain_layer_launch_us
from .gpu import describe_gpu
from .hf import hf_decode_costs, hf_transformers_config, transformers_version
from .kernels import Ops
from .specs import Grids, Record, Spec, plan_specs
from .tables import box_name_or_dict, profile_meta, slug, write_live_profile
from .timing import Bench, import_torch, require_cuda

T = TypeVar("T")

# Spare seconds kept for writing the profile when the budget decides what to skip.
WRITE_RESERVE_S = 10.0


def _progress(items: list[T], desc: str) -> Iterable[T]:
    """tqdm over items when tqdm is installed (the live extra), else the items."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="op", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)


def _log(msg: str) -> None:
    try:
        from tqdm import tqdm

        tqdm.write(f"pipesim: {msg}", file=sys.stderr)
    except ImportError:
        print(f"pipesim: {msg}", file=sys.stderr)


def measure_specs(
    specs: list[Spec], ops: Ops, bench: Bench, deadline: float, desc: str
) -> tuple[list[Record], dict]:
    """Time each spec; optional ones are skipped once past `deadline`; a spec that
    fails (out of memory for a huge shape) is logged and skipped, not fatal."""
    torch = ops.torch
    records, stats = [], {"skipped": 0, "failed": 0, "graph": 0, "eager": 0}
    last = None
    for spec in _progress(specs, desc):
        if not spec.required and time.monotonic() > deadline:
            stats["skipped"] += 1
            continue
        if spec.table != last and bench.cuda:
            torch.cuda.empty_cache()  # another kind of op: give its big inputs unfragmented memory
        last = spec.table
        try:
            built = ops.build(spec)
            # sampling draws random numbers and may sync: it is timed eagerly
            timed = [
                bench.time_ms(make, graph=spec.table != "sampling")
                for make in (built if isinstance(built, list) else [built])
            ]
            ms, method = min(timed)
            del built
        except (RuntimeError, MemoryError) as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
            stats["failed"] += 1
            if stats["failed"] <= 5:
                _log(
                    f"{spec.table} {spec.key}: not measured ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
                )
            if bench.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            continue
        stats[method] = stats.get(method, 0) + 1
        records.append(Record(spec.table, spec.key, ms, method))
    return records, stats


def _decode_loop_costs(
    torch: ModuleType,
    bench: Bench,
    ops: Ops,
    model: Model,
    cfg: dict | None,
    grids: Grids,
    deadline: float,
    live: dict,
    t0: float,
) -> tuple[dict, dict, list[dict]]:
    """(params, their sources, extras rows) of the decode loop's CPU costs: from the
    model's HF code when `cfg` is given, else from a plain-torch layer's launch and the
    CUDA-graph loop floor. Notes what the HF runs found in `live`."""
    params: dict = {}
    sources: dict = {}
    extras: list[dict] = []
    launch_us = plain_layer_launch_us(torch, bench, ops, model)
    floor_ms = graph_loop_floor_ms(torch, bench.device) if bench.cuda else 0.0
    extras += [
        {"op": "plain_layer_launch", "params": "batch=1", "value": sig6(launch_us / 1e3), "unit": "ms"},
        {"op": "graph_loop_floor", "params": "batch=1", "value": sig6(floor_ms), "unit": "ms"},
    ]
    if cfg is not None:
        costs, rows = hf_decode_costs(cfg, model, bench.device, grids, deadline, _log)
        _log(
            f"HF decode loop: {costs['cpu_iteration_ms']} ms per step + {costs['eager_launch_us_per_layer']} us "
            f"per layer (models of {costs['layers'][0]} and {costs['layers'][1]} layers) at "
            f"{time.monotonic() - t0:.0f} s"
        )
        extras += rows
        # the intercept is generate's own loop (its Python, the step's launches outside the
        # layers, the host sync): an engine's host loop is pipesim's host-loop terms
        # (costs/host.py), so it is kept as what it is, [live] hf_step_fixed_ms, for
        # calibration/e2e_check.py, and not charged to an engine's iterations twice
        params["eager_launch_us_per_layer"] = costs["eager_launch_us_per_layer"]
        la, lb = costs["layers"]
        how = (
            f"HF transformers {transformers_version()} generate (random weights, bf16, greedy, attention "
            f"{costs['impl'][0]}{', experts ' + costs['impl'][1] if costs['impl'][1] else ''}), models of {la} "
            f"and {lb} decoder layers run interleaved, medians at batch {costs['batches'][0]}: a step took "
            f"{costs['step_ms'][0]} / {costs['step_ms'][1]} ms"
        )
        sources["eager_launch_us_per_layer"] = f"measured: slope over depth of the eager decode step; {how}"
        live.update(
            hf_step_fixed_ms=costs["cpu_iteration_ms"],
            hf_layers=list(costs["layers"]),
            hf_step_ms=list(costs["step_ms"]),
            hf_kernel_ms=[k if k is not None else -1 for k in costs["kernel_ms"]],
            hf_attention=costs["impl"][0],
            hf_experts=costs["impl"][1],
            hf_transformers=transformers_version(),
        )
    else:
        params["cpu_iteration_ms"] = round(floor_ms, 4)
        params["eager_launch_us_per_layer"] = round(launch_us, 2)
        sources["cpu_iteration_ms"] = (
            "measured floor of a CUDA-graph decode loop (replay, argmax, token to host); "
            "an engine's scheduler adds its own Python on top"
        )
        sources["eager_launch_us_per_layer"] = (
            "measured: CPU time to launch one plain-torch decoder layer at "
            "batch 1 (the table operations, eagerly)"
        )
    return params, sources, extras


def run_live(
    model_arg: str,
    out: str | Path,
    *,
    hf_config: bool = False,
    name: str | None = None,
    budget_s: float = 420.0,
    reps: int = 30,
    warmup: int = 5,
    collectives: bool = True,
    grids: Grids | None = None,
    device: str = "cuda",
) -> Path:
    """Measure and write the profile (see the module docstring). `device="cpu"` runs
    the same code with wall-clock timing (for tests; the CLI insists on a GPU)."""
    grids = Grids() if grids is None else grids
    torch = import_torch()
    if device == "cuda":
        require_cuda(torch)
    if reps < 3 or warmup < 1 or budget_s <= 0:
        raise UserError(
            f"need --reps >= 3, --warmup >= 1 and --budget-s > 0 (got {reps}, {warmup}, {budget_s})"
        )
    model = load_model(model_arg)
    cfg = read_hf_config(model_arg)[0] if hf_config else None
    if cfg is not None:
        hf_transformers_config(
            cfg
        )  # fail now, not after minutes of measuring, if transformers cannot build it
    t0 = time.monotonic()
    deadline = t0 + budget_s - WRITE_RESERVE_S
    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    bench = Bench(torch, dev, reps, warmup)
    gpu = describe_gpu(torch, bench)
    _log(
        f"live calibration of {model.name} on {gpu['count']} x {gpu['name']} (torch {gpu['torch']}, "
        f"CUDA {gpu['cuda']}, driver {gpu['driver']}), budget {budget_s:.0f} s"
    )
    ops = Ops(torch, dev, model)
    specs = plan_specs(model, grids)
    required = [s for s in specs if s.required]
    optional = [s for s in specs if not s.required]
    records, stats = measure_specs(required, ops, bench, deadline, "required ops")
    _log(
        f"{len(records)} required operations timed ({stats['graph']} as CUDA graphs) at "
        f"{time.monotonic() - t0:.0f} s"
    )

    live: dict = {
        "reps": reps,
        "warmup": warmup,
        "budget_s": budget_s,
        "model": model.name,
        "moe_impl": ops.moe_impl or "",
        "hf_config": hf_config,
    }
    params, sources, extras = _decode_loop_costs(torch, bench, ops, model, cfg, grids, deadline, live, t0)
    floor_ms, _ = bench.time_ms(ops.gemm("bf16", 1, 64, 64))
    params["kernel_floor_us"] = round(floor_ms * 1e3, 3)
    sources["kernel_floor_us"] = "measured: a 1 x 64 x 64 bf16 GEMM, the shortest kernel (launch + tail)"
    if model.moe:
        params["moe_distribution"] = "power_law_1.01"
        sources["moe_distribution"] = (
            "both measured; real routing is skewed (physics.md §2): power_law_1.01 "
            "rows; a random-weight model routes near-uniformly: read 'balanced' for it"
        )

    box_name, box = box_name_or_dict(gpu)
    prof_name = name or f"live-{slug(gpu['name'])}-{slug(model.name)}"
    out = Path(out)

    def save(stage: str) -> Path:
        tables = sorted({r.table for r in records if r.table in TABLE_COLUMNS})
        live_now = dict(
            live,
            stage=stage,
            elapsed_s=round(time.monotonic() - t0, 1),
            skipped_optional=stats["skipped"],
            failed=stats["failed"],
            graph_ops=stats.get("graph", 0),
            eager_ops=stats.get("eager", 0),
        )
        meta = profile_meta(
            name=prof_name,
            model_arg=model_arg,
            gpu=gpu,
            box=box_name,
            params=params,
            param_sources=sources,
            tables=tables,
            reps=reps,
            warmup=warmup,
            live=live_now,
        )
        return write_live_profile(out, meta, records, extras, box)

    path = save("single-GPU tables")
    if gpu["count"] > 1 and collectives:
        limit = max(60.0, deadline - time.monotonic())
        _log(f"collectives and P2P over {gpu['count']} GPUs (at most {limit:.0f} s)")
        comm, note = measure_comm(gpu["count"], grids, reps=max(10, reps // 2), warmup=warmup, limit_s=limit)
        # the P2P rows set the box's links; no profile table holds them (hop costs read the box)
        records += [r for r in comm if r.table != "p2p"]
        live["collectives"] = note
        links = link_summary([r for r in comm if r.table == "p2p"])
        if links:
            gpu.update(links)
            box_name, box = box_name_or_dict(gpu)
        if note != "complete":
            _log(f"collectives {note}; the single-GPU tables are kept")
        path = save("collectives")
    more, more_stats = measure_specs(optional, ops, bench, deadline, "optional extras")
    records += more
    for k, v in more_stats.items():
        stats[k] = stats.get(k, 0) + v
    if stats["skipped"]:
        _log(f"budget: {stats['skipped']} optional measurements skipped (see [live] in profile.toml)")
    path = save("complete")
    _log(f"wrote {path} in {time.monotonic() - t0:.0f} s")
    return path

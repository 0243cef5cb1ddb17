"""A measured table against physics: what the GPU it was measured on can do at most (its
datasheet figures, in the box preset) and how latency grows with size. A table outside
these bounds is refused with one line naming its file, the row and the likely unit
mistake, when it is loaded and before a profile is written (an import).

Each row's work, from its key columns (the sizes are per GPU, tables.TABLE_COLUMNS):

- gemm: 2 m n k FLOPs; at least its weights (n k x the dtype's bytes) and bf16
  activations (2 (m k + m n) bytes) move through memory;
- moe, moe_ep: 2 x tokens x topk x 3 hidden inter / moe_tp FLOPs (gate, up and down
  projections; one EP rank's share: / moe_ep), at least one expert's weights;
- mla_decode: 2 batch heads context (576 + 512) FLOPs and batch x context x 576 x 2
  bytes of compressed KV cache (DeepSeek's MLA: kv_lora_rank 512 + rope 64, bf16);
- mla_prefill: 2 batch heads isl^2 / 2 (192 + 128) FLOPs (causal);
- gqa_decode: 4 batch heads context head_dim FLOPs, batch x context x 2 kv_heads x
  head_dim x 2 bytes of KV cache; gqa_prefill: 4 batch heads isl^2 / 2 head_dim FLOPs;
- collectives: the bytes the busiest link carries, nbytes x 2 (n - 1) / n for an
  all-reduce, x (n - 1) / n for an all-gather, reduce-scatter or all-to-all (NCCL's bus
  bandwidth, nccl-tests doc/PERFORMANCE.md), nbytes for a send / receive.

The bounds, each with the observation it leaves room for (the shipped profiles and the
derived AIConfigurator tables of ten GPUs, calibration/catalogue: none comes near):

- nothing completes in under 1 us (a kernel launch alone takes 2-5 us; the fastest
  measured row anywhere is 2.4 us);
- too fast, a unit too small (seconds written as milliseconds): no row may compute
  faster than COMPUTE_FACTOR x the GPU's fastest datasheet tensor rate (measured: at
  most 0.96x), move its bytes faster than MEMORY_FACTOR x its memory bandwidth (4.7x
  measured where a working set sits in a large L2 cache, L40S), or a collective's bus
  bandwidth exceed LINK_FACTOR x the box's fastest link (1.25x measured);
- too slow, a unit too large (microseconds written as milliseconds): the table's best
  row must come within SLOW_FACTOR of its roofline (the datasheet rates, a kernel's
  KERNEL_FLOOR_S or a collective's COLLECTIVE_FLOOR_S, the slowest link) (measured:
  every table's best row within 2.3x);
- monotone: along a table's size axis (m, tokens, context, isl, nbytes) latency grows
  with size, so no row may be more than DROP_FACTOR times faster than a smaller size of
  the same shape (measured: 83x at worst, one row of a vLLM decode table; a row in the
  wrong unit among right ones is 1000x).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..base.errors import UserError, require
from ..inputs.box import Box, load_box
from .tables import TABLE_COLUMNS

COMPUTE_FACTOR = 1.5
MEMORY_FACTOR = 20.0
LINK_FACTOR = 4.0
SLOW_FACTOR = 20.0
DROP_FACTOR = 250.0
MIN_LATENCY_MS = 1e-3
KERNEL_FLOOR_S = 5e-6
COLLECTIVE_FLOOR_S = 20e-6
# bytes per weight of a kernel table's dtype (quantization.py's formats; unknown: 1)
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "nvfp4": 0.5, "mxfp4": 0.5}
MLA_KV, MLA_V, MLA_QK = 576, 512, 192 + 128  # DeepSeek's MLA widths (module docstring)
SIZE_AXIS = {
    "gemm": "m",
    "moe": "tokens",
    "moe_ep": "tokens",
    "mla_decode": "context",
    "mla_prefill": "isl",
    "gqa_decode": "context",
    "gqa_prefill": "isl",
    "collectives": "nbytes",
}


@dataclass(frozen=True)
class Datasheet:
    """What the GPU and box a table was measured on can do at most: FLOP/s (the fastest
    tensor rate and the bf16 one), memory bytes/s, and the fastest and slowest link."""

    name: str
    flops_max: float
    flops_bf16: float
    mem_bw: float
    link_max: float | None  # a box of one GPU has no link
    link_min: float | None

    @classmethod
    def of(cls, box: Box) -> Datasheet:
        g, links = box.gpu, [lk.bw_bytes_s for lk in box.links]
        return cls(
            f"{g.name} (box {box.name})",
            max(g.flops_bf16, g.flops_fp8, g.flops_fp4),
            g.flops_bf16,
            g.mem_bw_bytes_s,
            max(links, default=None),
            min(links, default=None),
        )


def datasheet(box: str | Path) -> Datasheet | None:
    """The datasheet of a profile's box (a preset or a box file); None where it cannot be
    read (the profile is then costed on the run's --box, whose own checks apply)."""
    try:
        return Datasheet.of(load_box(box))
    except UserError:
        return None


def check_tables(columns: Mapping[str, dict], origin: Callable[[str], str], sheet: Datasheet | None) -> None:
    """Every table of a profile within the bounds; `origin(table)` names its file."""
    for table, cols in columns.items():
        check_bounds(cols, table, origin(table), TABLE_COLUMNS[table], sheet)


def _f(cols: dict, name: str) -> np.ndarray:
    return np.asarray(cols[name], dtype=float)


def work(table: str, cols: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes moved at least, bytes moved at most) of every row (module docstring)."""
    if table == "gemm":
        m, n, k = _f(cols, "m"), _f(cols, "n"), _f(cols, "k")
        w = np.array([WEIGHT_BYTES.get(str(d), 1.0) for d in cols["dtype"]])
        nbytes = n * k * w + 2.0 * (m * k + m * n)
        return 2.0 * m * n * k, nbytes, nbytes
    if table in ("moe", "moe_ep"):
        t, h, i, topk, e = (_f(cols, c) for c in ("tokens", "hidden", "inter", "topk", "experts"))
        ep = _f(cols, "moe_ep") if table == "moe_ep" else 1.0
        expert = (
            3.0
            * h
            * i
            / _f(cols, "moe_tp")
            * np.array([WEIGHT_BYTES.get(str(d), 1.0) for d in cols["dtype"]])
        )
        touched = np.maximum(1.0, e / ep * (1.0 - (1.0 - topk / e) ** t))  # balanced routing: the most
        return 2.0 * t * topk * 3.0 * h * i / _f(cols, "moe_tp") / ep, expert, expert * touched + 4.0 * t * h
    if table == "mla_decode":
        b, heads, ctx = _f(cols, "batch"), _f(cols, "heads_per_gpu"), _f(cols, "context")
        kv = b * ctx * MLA_KV * 2.0
        return 2.0 * b * heads * ctx * (MLA_KV + MLA_V), kv, kv
    if table == "mla_prefill":
        b, heads, isl = _f(cols, "batch"), _f(cols, "heads_per_gpu"), _f(cols, "isl")
        return 2.0 * b * heads * isl * isl / 2.0 * MLA_QK, 0.0 * b, b * isl * heads * MLA_QK * 2.0
    if table == "gqa_decode":
        b, heads, ctx = _f(cols, "batch"), _f(cols, "heads_per_gpu"), _f(cols, "context")
        kv = b * ctx * 2.0 * _f(cols, "kv_heads_per_gpu") * _f(cols, "head_dim") * 2.0
        return 4.0 * b * heads * ctx * _f(cols, "head_dim"), kv, kv
    if table == "gqa_prefill":
        b, heads, isl, d = _f(cols, "batch"), _f(cols, "heads_per_gpu"), _f(cols, "isl"), _f(cols, "head_dim")
        act = b * isl * (heads + 2.0 * _f(cols, "kv_heads_per_gpu")) * d * 2.0 * 2.0
        return 4.0 * b * heads * isl * isl / 2.0 * d, 0.0 * b, act
    raise ValueError(f"no work model for table {table}")


def link_bytes(cols: dict) -> np.ndarray:
    """The bytes a collective's busiest link carries (NCCL's bus bandwidth factor)."""
    n, nbytes = _f(cols, "gpus"), _f(cols, "nbytes")
    ops = np.asarray(cols["op"]).astype(str)
    factor = np.where(
        ops == "all_reduce",
        2.0 * (n - 1.0) / n,
        np.where(np.isin(ops, ("all_gather", "reduce_scatter", "alltoall")), (n - 1.0) / n, 1.0),
    )
    return nbytes * factor


def _row(cols: dict, table: str, i: int, keys: tuple[str, ...]) -> str:
    shown = ", ".join(f"{k}={cols[k][i]}" for k in keys)
    return f"line {i + 2} ({shown}, latency_ms {float(cols['latency_ms'][i]):.4g})"


def check_bounds(cols: dict, table: str, origin: str, keys: tuple[str, ...], sheet: Datasheet | None) -> None:
    """Refuse a table (its checked numpy columns) outside the module docstring's bounds;
    without a datasheet (a profile whose box cannot be read), the floor and the monotone
    check alone."""
    lat_ms = np.asarray(cols["latency_ms"], dtype=float)
    if not len(lat_ms):
        return
    low = np.flatnonzero(lat_ms < MIN_LATENCY_MS)
    if len(low):
        i = int(low[0])
        raise UserError(
            f"{origin}: {_row(cols, table, i, keys)}: faster than any GPU operation (under 1 us); "
            "latency_ms is in milliseconds: was it written in seconds?"
        )
    _monotone(cols, table, origin, keys, lat_ms)
    if sheet is None:
        return
    lat = lat_ms * 1e-3
    if table == "collectives":
        if sheet.link_max is None or sheet.link_min is None:
            return
        carried = link_bytes(cols)
        fast = carried / lat / sheet.link_max
        i = int(np.argmax(fast))
        require(
            fast[i] <= LINK_FACTOR,
            f"{origin}: {_row(cols, table, i, keys)}: {carried[i] / lat[i] / 1e9:,.0f} GB/s on a link, "
            f"{fast[i]:,.0f}x the fastest link of {sheet.name} ({sheet.link_max / 1e9:,.0f} GB/s, above "
            f"the {LINK_FACTOR:g}x allowed); latency_ms is in milliseconds: was it written in seconds?",
        )
        ref = carried / sheet.link_min + COLLECTIVE_FLOOR_S
    else:
        flops, least, most = work(table, cols)
        rate, speed = flops / lat / sheet.flops_max, least / lat / sheet.mem_bw
        i = int(np.argmax(rate))
        require(
            rate[i] <= COMPUTE_FACTOR,
            f"{origin}: {_row(cols, table, i, keys)}: {flops[i] / lat[i] / 1e12:,.0f} TFLOP/s, "
            f"{rate[i]:,.1f}x the datasheet's fastest tensor rate of {sheet.name} "
            f"({sheet.flops_max / 1e12:,.0f} TFLOP/s, above the {COMPUTE_FACTOR:g}x allowed); "
            "latency_ms is in milliseconds: was it written in seconds?",
        )
        i = int(np.argmax(speed))
        require(
            speed[i] <= MEMORY_FACTOR,
            f"{origin}: {_row(cols, table, i, keys)}: {least[i] / lat[i] / 1e12:,.1f} TB/s of memory "
            f"traffic, {speed[i]:,.0f}x the datasheet bandwidth of {sheet.name} "
            f"({sheet.mem_bw / 1e12:,.2f} TB/s, above the {MEMORY_FACTOR:g}x allowed); latency_ms is in "
            "milliseconds: was it written in seconds?",
        )
        ref = np.maximum(flops / sheet.flops_bf16, most / sheet.mem_bw) + KERNEL_FLOOR_S
    slow = lat / ref
    i = int(np.argmin(slow))
    require(
        slow[i] <= SLOW_FACTOR,
        f"{origin}: even its fastest row, {_row(cols, table, i, keys)}, takes {slow[i]:,.0f}x the "
        f"roofline of {sheet.name} (at most {SLOW_FACTOR:g}x allowed); latency_ms is in milliseconds: "
        "was it written in microseconds?",
    )


def _monotone(cols: dict, table: str, origin: str, keys: tuple[str, ...], lat: np.ndarray) -> None:
    """No row DROP_FACTOR times faster than a smaller size of its shape (the other keys)."""
    axis = SIZE_AXIS[table]
    shape = [np.asarray(cols[k]) for k in keys if k != axis]
    order = np.lexsort((np.asarray(cols[axis], dtype=float), *reversed(shape)))
    starts = np.zeros(len(order), dtype=bool)
    starts[0] = True
    for col in shape:
        c = col[order]
        starts[1:] |= c[1:] != c[:-1]
    group = np.cumsum(starts) - 1
    # the running max of log latency within each shape: groups offset far apart
    logs = np.log(lat[order]) + group * 1e3
    running = np.maximum.accumulate(logs)
    drop = np.full(len(order), 0.0)
    drop[1:] = np.where(starts[1:], 0.0, running[:-1] - logs[1:])
    j = int(np.argmax(drop))
    if drop[j] > np.log(DROP_FACTOR):
        i = int(order[j])
        raise UserError(
            f"{origin}: {_row(cols, table, i, keys)} is {np.exp(drop[j]):,.0f}x faster than a smaller "
            f"{axis} of the same shape (more than the {DROP_FACTOR:g}x allowed: latency grows with size); "
            "is one row in another unit?"
        )

"""Collectives: all-reduce, all-gather, reduce-scatter and all-to-all, in seconds. No SimPy here.

One model, two sources (docs/physics.md §4, docs/collectives.md):

- **A measured table** (the profile's `collectives` curves by op, implementation and
  group size: AIConfigurator's nccl_perf / custom_allreduce_perf, nccl-tests, a live
  run). Each curve is split into a latency part and a bandwidth part: t(s) ~ alpha + s /
  beta is fitted to its points by least squares in relative error (`split_fit`, alpha,
  1/beta >= 0); alpha, the time a collective takes however small, is the latency part,
  and what a point takes beyond it, t(s) - alpha, is the time its bytes spend on the
  links. On the box the table was measured on the table is read as it is; on a box whose
  links carry k times the bandwidth (a `--pcie-bandwidth-scale` what-if, or a table
  borrowed from another box) the bandwidth part is divided by k:
      t'(s) = min(alpha, t(s)) + max(t(s) - alpha, 0) / k,
  k = the narrowest link of the group's ring here / on the measured box. Such a value is
  tagged `scaled` (its latency is measured, its bandwidth part rescaled by a datasheet
  ratio); at k = 1 the table keeps its own provenance (measured / interpolated /
  extrapolated).
- **NCCL's own model** where no table applies: the algorithms and protocols NCCL
  2.29.2 weighs and its latency / bandwidth formula for each, from its source
  (github.com/NVIDIA/nccl, tag v2.29.2-1, src/graph/tuning.cc `ncclTopoTuneModel` and
  `ncclTopoGetAlgoTime`): for every enabled (algorithm, protocol)

      time = latency + bytes / algorithm bandwidth,

  and NCCL runs the fastest. Ring (every collective), Tree (all-reduce) and, on an
  NVSwitch of Hopper or later, NVLS (NVLink SHARP: all-reduce, all-gather,
  reduce-scatter); protocols LL, LL128 (only over NVLink: LL128 is enabled only where
  the ring's links are NVLink, `typeIntra <= PATH_NVB`) and Simple. Ring latency =
  base[p] + steps x hw[fabric][p] (steps 2(n-1) for an all-reduce, n-1 for an
  all-gather or reduce-scatter), Tree latency = base[p] + 2(n-1) hw[fabric][p], NVLS
  latency = 25 us; bus bandwidth = the ring's narrowest link, derated per protocol as
  NCCL derates it (LL: half, capped by llMaxBw of the GPU generation; LL128: 0.92; Tree:
  0.92, LL /3.8, LL128 x 7/9, its size correction factors; NVLS: nvlsEfficiency, doubled
  for an all-reduce), converted to algorithm bandwidth by n / steps (Ring, NVLS) or 1/2
  (Tree). An all-to-all (NCCL's grouped send/recv, outside tuning.cc) moves (n-1)/n of
  each rank's buffer over its own link after a fixed latency. Two numbers per fabric
  class are calibrated on measured tables of comparable boxes (`calibration/
  fit_collectives.py`, `pipesim/data/collective_fit.json`, leave-one-box-out errors in
  docs/collectives.md): a scale on NCCL's latencies and the share of the link NCCL's bus
  bandwidth reaches, and for the all-to-all its latency and link share. Costs from it
  are tagged `roofline (fitted)` (plain `roofline` without the fit file).

Fabric classes: `nvlink` (the box's GPUs meet at an NVSwitch or over NVLink), `pcie`
(everything else; a box whose description says it has no P2P moves data through host
memory, which its link bandwidths already state). A group spanning nodes runs NCCL's
ring with the network's latencies (hw NET) between nodes, over the narrowest link
(the NIC's); the profile's all-reduce scale and offset apply to one box's own path only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, TypedDict

from .roofline import PROVENANCE_FITTED

if TYPE_CHECKING:
    from ..inputs.box import Box
    from ..profiles.curves import Curve
    from ..profiles.profile import Profile

FIT_FILE = "collective_fit.json"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
PROTOCOLS = ("LL", "LL128", "Simple")
SCALED = "scaled"  # a measured table value whose bandwidth part was rescaled to this box's links


class HwLatency(TypedDict, total=False):
    """One fabric's hardware latencies (us): (LL, LL128, Simple) per algorithm, NVLS on NVLink."""

    tree: tuple[float, float, float]
    ring: tuple[float, float, float]
    nvls: float


# ---- NCCL v2.29.2-1, src/graph/tuning.cc (ncclTunerConstantsDefaults), microseconds and GB/s ----
BASE_LAT_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}  # (LL, LL128, Simple)
HW_LAT_US: dict[str, HwLatency] = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": 25.0},
    "pcie": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
LL_MAX_BW_GBS = {70: 39.0, 80: 87.7, 90: 141.0, 100: 282.0}  # llMaxBws, one node, by generation
NVLS_EFFICIENCY = {90: 0.85, 100: 0.74}
NET_OVERHEAD_US = 1.0  # getNetOverhead: per ring step once the ring leaves the node (Intel x86)
LL128_RING_FACTOR = 0.92
TREE_FACTOR, TREE_LL_FACTOR, TREE_LL128_FACTOR = 0.92, 1.0 / 3.8, 7.0 / 9.0
# treeCorrectionFactor[protocol][log2(bytes / 64)], powers of two from 64 B
TREE_CORRECTION = tuple(
    tuple(float(x) for x in row.split())
    for row in (
        "1.0 1.0 1.0 1.0 .9 .8 .7 .7 .7 .7 .6 .5 .4 .4 .5 .6 .7 .8 .9 1.0 1.0 1.0 1.0",  # LL
        "1.0 1.0 1.0 1.0 1.0 .9 .8 .8 .8 .7 .6 .6 .6 .6 .6 .6 .8 .9 .9 .9 .9 1.0 1.0",  # LL128
        ".9 .9 .9 .9 .9 .9 .9 .8 .7 .6 .6 .5 .5 .5 .5 .6 .7 .8 .7 .7 .8 .9 .9",  # Simple
    )
)
# GPU name fragment -> compute generation (NCCL's compCapIndex: Ampere 80, Hopper 90, Blackwell 100)
GENERATIONS = (
    ("b300", 100),
    ("b200", 100),
    ("gb200", 100),
    ("blackwell", 100),
    ("5090", 100),
    ("h100", 90),
    ("h200", 90),
    ("h20", 90),
    ("v100", 70),
)


@dataclass(frozen=True)
class Fabric:
    """What NCCL's model needs to know of the links a group's ring runs over."""

    kind: str  # "nvlink" or "pcie"
    nvswitch: bool  # the GPUs meet at an NVSwitch (NVLS possible from Hopper on)
    generation: int  # 70 / 80 / 90 / 100: the GPU's compute generation as NCCL indexes it
    bus_bw_bytes_s: float  # the narrowest link of the ring, per direction
    nodes: int = 1  # nodes the group spans
    net_latency_us: float = 0.0  # the network's own latency between nodes (NCCL's latencyInter)


def generation(gpu_name: str) -> int:
    """NCCL's compute generation of a GPU by its name (Ampere's, 80, when not listed:
    the constants differ only in the LL bandwidth cap and NVLS)."""
    name = gpu_name.lower()
    return next((g for frag, g in GENERATIONS if frag in name), 80)


def fabric_kind(box: Box) -> str:
    """`nvlink` when the box's GPUs are joined by NVLink (an NVSwitch node, or a link
    named for NVLink), else `pcie`."""
    names = {n.lower() for lk in box.links for n in (lk.child, lk.parent)}
    return "nvlink" if any("nvswitch" in n or "nvlink" in n for n in names) else "pcie"


def fabric_of(box: Box, gpus: tuple[int, ...], bus_bw_bytes_s: float) -> Fabric:
    kind = fabric_kind(box)
    nodes = len({box.node_of(g) for g in gpus}) if box.nodes > 1 else 1
    net_us = box.network.latency_s * 1e6 if nodes > 1 and box.network is not None else 0.0
    return Fabric(kind, kind == "nvlink", generation(box.gpu.name), bus_bw_bytes_s, nodes, net_us)


@dataclass(frozen=True)
class ClassFit:
    """The calibrated numbers of one fabric class (module docstring)."""

    latency_scale: float = 1.0  # x NCCL's latency constants
    bus_eff: float = 1.0  # NCCL's bus bandwidth / the ring's narrowest link
    a2a_latency_us: float = 8.4  # an all-to-all's fixed latency (NCCL's Simple base without a fit)
    a2a_eff: float = 1.0  # an all-to-all's per-rank bandwidth / its link


@dataclass(frozen=True)
class NcclFit:
    classes: tuple[tuple[str, ClassFit], ...]
    source: str

    def of(self, kind: str) -> ClassFit:
        return dict(self.classes).get(kind, ClassFit())


NEUTRAL = NcclFit((), "NCCL's constants as published, the link's whole bandwidth (no fit)")


@lru_cache(maxsize=1)
def shipped_fit() -> NcclFit | None:
    """The calibration shipped with pipesim (None without the file)."""
    path = resources.files("pipesim.data") / FIT_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    classes = tuple(
        (k, ClassFit(**{f: float(v[f]) for f in ClassFit.__dataclass_fields__}))
        for k, v in data["classes"].items()
    )
    return NcclFit(classes, data.get("source", ""))


def _steps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def nccl_candidates(op: str, n: int, nbytes: float, fabric: Fabric, fit: ClassFit) -> dict[str, float]:
    """Seconds of every (algorithm/protocol) NCCL would weigh for this collective on one
    node, `algo/proto` -> seconds (module docstring; NCCL v2.29.2-1 tuning.cc)."""
    steps = _steps(op, n)
    hw = HW_LAT_US[fabric.kind]
    bus = fit.bus_eff * fabric.bus_bw_bytes_s / 1e9  # GB/s
    ll_max = LL_MAX_BW_GBS.get(fabric.generation, LL_MAX_BW_GBS[80])
    out = {}
    for p, proto in enumerate(PROTOCOLS):
        if proto == "LL128" and fabric.kind != "nvlink":
            continue  # LL128 only where the ring's links are NVLink
        busbw = {"LL": min(ll_max, 0.5 * bus), "LL128": LL128_RING_FACTOR * bus, "Simple": bus}[proto]
        lat = fit.latency_scale * (BASE_LAT_US["ring"][p] + steps * hw["ring"][p])
        out[f"ring/{proto}"] = (lat + nbytes / (busbw * 1e3 * n / steps)) * 1e-6
        if op == "all_reduce":
            tb = TREE_FACTOR * bus
            tb = {"LL": min(tb * TREE_LL_FACTOR, ll_max), "LL128": tb * TREE_LL128_FACTOR, "Simple": tb}[
                proto
            ]
            log_size = int(math.log2(max(nbytes, 64) // 64))
            if log_size < len(TREE_CORRECTION[p]):
                tb *= TREE_CORRECTION[p][log_size]
            lat = fit.latency_scale * (BASE_LAT_US["tree"][p] + 2 * (n - 1) * hw["tree"][p])
            out[f"tree/{proto}"] = (lat + nbytes / (tb * 1e3 * 0.5)) * 1e-6
    if fabric.nvswitch and fabric.generation in NVLS_EFFICIENCY and op != "alltoall":
        nv = bus * NVLS_EFFICIENCY[fabric.generation] * (2.0 if op == "all_reduce" else (n - 1) / n)
        out["nvls/Simple"] = (
            fit.latency_scale * HW_LAT_US["nvlink"]["nvls"] + nbytes / (nv * 1e3 * n / steps)
        ) * 1e-6
    return out


def nccl_time(op: str, n: int, nbytes: float, fabric: Fabric, fit: ClassFit) -> tuple[float, str]:
    """(seconds, `algo/proto` NCCL would pick) of a collective over `n` GPUs of `fabric`."""
    if op == "alltoall":  # grouped send/recv: (n-1)/n of the buffer leaves over each rank's link
        bw = fit.a2a_eff * fabric.bus_bw_bytes_s
        return fit.a2a_latency_us * 1e-6 + (n - 1) / n * nbytes / bw, "p2p"
    if fabric.nodes > 1:
        return cross_node_time(op, n, nbytes, fabric, fit)
    cands = nccl_candidates(op, n, nbytes, fabric, fit)
    best = min(cands, key=cands.__getitem__)
    return cands[best], best


def cross_node_time(op: str, n: int, nbytes: float, fabric: Fabric, fit: ClassFit) -> tuple[float, str]:
    """NCCL's ring over nodes (tuning.cc, nNodes > 1): the 2(nodes-1) (all-reduce) or
    nodes-1 steps that cross the network pay hw NET latency plus the network's own
    (twice for Simple: NCCL adds the flush), the others the box's own (LL's x 1.8, at
    least NCCL's 1 us network overhead per step, x 3 for Simple); LL128 is left out
    (NCCL enables it over the network only from Hopper with a NIC per GPU pair, not
    modelled); bandwidth = the narrowest link (the NIC's) at the class's bus share."""
    steps = _steps(op, n)
    inter = 2 * (fabric.nodes - 1) if op == "all_reduce" else fabric.nodes - 1
    bus = fit.bus_eff * fabric.bus_bw_bytes_s / 1e9
    out = {}
    for p, proto in enumerate(PROTOCOLS):
        if proto == "LL128":
            continue
        intra = HW_LAT_US[fabric.kind]["ring"][p] * (1.8 if proto == "LL" else 1.0)
        intra = max(intra, NET_OVERHEAD_US * (3.0 if proto == "Simple" else 1.0))
        net = HW_LAT_US["net"]["ring"][p] + fabric.net_latency_us * (2.0 if proto == "Simple" else 1.0)
        lat = BASE_LAT_US["ring"][p] + (steps - inter) * intra + inter * net
        busbw = min(0.5 * bus, LL_MAX_BW_GBS[80]) if proto == "LL" else bus
        out[f"ring/{proto}"] = (fit.latency_scale * lat + nbytes / (busbw * 1e3 * n / steps)) * 1e-6
    best = min(out, key=out.__getitem__)
    return out[best], best


# ---- a measured table: its latency and bandwidth parts --------------------------------------


@dataclass(frozen=True)
class Split:
    """t(s) ~ latency + s / bandwidth fitted to one measured curve (relative least squares)."""

    latency_s: float
    bw_bytes_s: float  # inf when the curve never grows with size
    median_rel_err: float
    max_rel_err: float

    def predict(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bw_bytes_s


def split_fit(xs_bytes: list[float], ys_s: list[float]) -> Split:
    """Fit t = a + g s to the points, minimising sum((a + g s_i) / t_i - 1)^2 with a, g >= 0
    (the two-variable non-negative least squares solved by its cases)."""
    rows = [(1.0 / t, s / t) for s, t in zip(xs_bytes, ys_s) if t > 0]
    if not rows:
        return Split(0.0, math.inf, 0.0, 0.0)

    def solve(use_a: bool, use_g: bool) -> tuple[float, float]:
        s11 = sum(a * a for a, _ in rows)
        s22 = sum(g * g for _, g in rows)
        s12 = sum(a * g for a, g in rows)
        b1 = sum(a for a, _ in rows)
        b2 = sum(g for _, g in rows)
        if use_a and use_g:
            det = s11 * s22 - s12 * s12
            if det > 0:
                return (b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det
            return -1.0, -1.0
        if use_a:
            return b1 / s11, 0.0
        return 0.0, b2 / s22 if s22 > 0 else 0.0

    a, g = solve(True, True)
    if a < 0 or g < 0:
        cands = [solve(True, False), solve(False, True)]
        a, g = min(cands, key=lambda c: sum((c[0] * x + c[1] * y - 1.0) ** 2 for x, y in rows))
    errs = sorted(abs((a + g * s) / t - 1.0) for s, t in zip(xs_bytes, ys_s) if t > 0)
    med = errs[len(errs) // 2] if len(errs) % 2 else 0.5 * (errs[len(errs) // 2 - 1] + errs[len(errs) // 2])
    return Split(a, 1.0 / g if g > 0 else math.inf, med, errs[-1])


def split_curve(curve: Curve) -> Split:
    """The split of a profile's collective curve (sizes in bytes, latencies in ms)."""
    return split_fit(list(curve.xs), [y * 1e-3 for y in curve.ys])


def rescaled(t_s: float, latency_s: float, k: float) -> float:
    """A table time with its bandwidth part (beyond the fitted latency) divided by k."""
    lat = min(latency_s, t_s)
    return lat + (t_s - lat) / k


# ---- one group's collectives on one box ---------------------------------------------------------


class Collectives:
    """Every collective of one (box, profile): the profile's measured curve, its bandwidth
    part rescaled to this box's links, else NCCL's model (module docstring)."""

    def __init__(self, box: Box, profile: Profile, fit: NcclFit | None = None):
        self.box, self.profile, self.params = box, profile, profile.params
        chosen = shipped_fit() if fit is None else fit
        self.model_source = PROVENANCE_FITTED if chosen is not None else "roofline"
        self.fit: NcclFit = NEUTRAL if chosen is None else chosen
        self._measured_on = measured_box(profile) if profile.collectives else None
        self._splits: dict = {}
        self._ratio: dict = {}
        self._fabrics: dict = {}

    def time(self, op: str, gpus: tuple[int, ...], nbytes: float) -> tuple[float, str]:
        """(seconds, provenance) of `op` over `gpus` moving `nbytes` (an all-gather's or
        reduce-scatter's whole buffer, an all-to-all's per-rank buffer)."""
        n = len(gpus)
        if n < 2 or nbytes <= 0:
            return 0.0, "measured"
        p = self.params
        if self.box.spans_nodes(gpus):
            fab = self.fabric(gpus)
            return nccl_time(op, n, nbytes, fab, self.fit.of(fab.kind))[0], "roofline"
        impls = ("custom", "nccl") if (op == "all_reduce" and n <= p.custom_allreduce_max_gpus) else ("nccl",)
        for impl in impls:
            curve = self.profile.collectives.get((op, impl, n))
            if curve is not None:
                t, source = curve(nbytes) * 1e-3, curve.provenance(nbytes)
                k = self.bandwidth_ratio(gpus)
                if k != 1.0:
                    key = (op, impl, n)
                    split = self._splits.get(key) or self._splits.setdefault(key, split_curve(curve))
                    t, source = rescaled(t, split.latency_s, k), SCALED
                break
        else:
            fab = self.fabric(gpus)
            t, source = nccl_time(op, n, nbytes, fab, self.fit.of(fab.kind))[0], self.model_source
        if op == "all_reduce":
            t = t * p.allreduce_scale + p.allreduce_offset_us * 1e-6
        return t, source

    def fabric(self, gpus: tuple[int, ...]) -> Fabric:
        """The links the group's ring runs over (cached per group)."""
        hit = self._fabrics.get(gpus)
        if hit is None:
            hit = self._fabrics[gpus] = fabric_of(self.box, gpus, ring_bw(self.box, gpus))
        return hit

    def bandwidth_ratio(self, gpus: tuple[int, ...]) -> float:
        """The ring's narrowest link over `gpus` here / on the box the table was measured
        on (1 when that box is unknown or lacks these GPUs)."""
        hit = self._ratio.get(gpus)
        if hit is None:
            there = self._measured_on
            hit = 1.0
            if there is not None and there.nodes == 1:
                # the nodes of a cluster are copies of the measured box: the group's GPUs there
                local = tuple(g % there.gpu_count for g in gpus)
                if len(set(local)) == len(gpus):
                    hit = ring_bw(self.box, gpus) / ring_bw(there, local)
            self._ratio[gpus] = hit
        return hit


def ring_bw(box: Box, gpus: tuple[int, ...]) -> float:
    """Bytes/s of the narrowest link of the ring over `gpus` (one GPU: its memory)."""
    ring = box.ring_links(gpus)
    return min(box.link(d).bw_bytes_s for d in ring) if ring else box.gpu.mem_bw_bytes_s


def measured_box(profile: Profile) -> Box | None:
    """The box a profile's tables were measured on: for AIConfigurator's tables the preset
    of the chassis they were measured in (catalogue.measured_chassis), else the box the
    profile was built for, else its named preset (never the scenario's own box, which a
    what-if may have changed); None when none can be read."""
    from ..base.errors import UserError
    from ..inputs.box import load_box

    chassis = profile.meta.get("collectives_measured_on")
    if chassis:
        return load_box(chassis)
    if profile.box_spec is not None:
        return profile.box_spec

    try:
        return load_box(profile.box) if profile.box else None
    except UserError:
        return None


__all__ = [
    "ClassFit",
    "Collectives",
    "Fabric",
    "NcclFit",
    "fabric_of",
    "nccl_time",
    "split_fit",
]

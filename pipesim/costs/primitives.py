"""Primitive costs: one kernel, one collective, one PP hop, in seconds. No SimPy here.

Each operation is read from the profile's measured table (interpolated, see
profiles/curves.py) when it has one, else estimated by a roofline:

    t = max(bytes / memory_bandwidth, flops / tensor_rate) + kernel_floor

(kernel_floor: the profile's shortest measured kernel). On a GPU whose profile has no
measured kernel at all, the roofline is calibrated instead: per operation class an
efficiency curve fitted on the GPUs that were measured (roofline.py, docs/roofline.md),
tagged "roofline (fitted)".
For MoE the bytes read grow with the expected number of distinct experts the batch
touches, E * (1 - (1 - k/E)^T) under uniform routing. Collectives are collectives.py's
one model: the measured table by (op, group size, bytes) with its bandwidth part on this
box's links, else NCCL's own algorithm / protocol model calibrated on measured fabrics
(over the network when the group spans nodes); a PP hop is link latency + bytes /
bandwidth along the box's PCIe path, across the nodes of a cluster the NIC path.

Every operation time carries its provenance (provenance.py): read at a measured point,
interpolated between points, extrapolated outside the table's range, estimated by the
roofline, or borrowed (read from a profile measured on another box, GPU or engine).
A stage composes these (stage.py); expert parallel's layer and token traffic are
moe.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..base.errors import require
from ..inputs.box import Box, LinkDir
from ..inputs.model import Model
from ..inputs.plan import Plan
from ..inputs.quantization import WeightFormat, as_format
from ..profiles.curves import bracket, grid_provenance, weakest
from ..profiles.profile import Profile
from .collectives import Collectives, ring_bw
from .host import hop_cpu_s
from .roofline import PROVENANCE_FITTED, shipped_fit
from .routing import busiest_rank, routed_time

ACT_BYTES = 2  # activations are bf16
# A profile with none of these measured has never timed a kernel on its GPU: its
# roofline uses the efficiency curves fitted on measured GPUs (roofline.py).
KERNEL_TABLES = ("gemm", "moe", "gqa_decode", "gqa_prefill", "mla_decode", "mla_prefill")


class Op(NamedTuple):
    name: str
    seconds: float  # for one layer / one occurrence
    # the field shadows tuple.count (a method), which nothing here calls: the checker
    # refuses the override whatever the code does with it
    count: int  # type: ignore[assignment]  # occurrences in the stage
    source: str  # its provenance, one of PROVENANCE
    kind: str  # "compute" or "tp_comm"


@dataclass(frozen=True)
class Shape:
    """What a micro-batch asks of a stage."""

    decode: int = 0  # decode tokens (one per request)
    decode_ctx: int = 0  # mean context of the decode requests
    prefill: tuple[tuple[int, int], ...] = ()  # (chunk tokens, prefix tokens) per request
    graphed: bool = True  # replayed from a CUDA graph (else launched eagerly)

    @property
    def tokens(self) -> int:
        return self.decode + sum(c for c, _ in self.prefill)


def distinct_experts(tokens: float, experts: int, topk: int) -> float:
    """Expected number of distinct experts `tokens` tokens touch under uniform top-k routing."""
    return experts * (1.0 - (1.0 - topk / experts) ** tokens)


class Primitives:
    """Kernel, collective and hop costs on one (box, model, plan, profile)."""

    def __init__(self, box: Box, model: Model, plan: Plan, profile: Profile):
        self.box, self.model, self.plan, self.profile = box, model, plan, profile
        self.params = profile.params
        self.floor_s = self.params.kernel_floor_us * 1e-6
        # costs read from a profile measured elsewhere are reported as borrowed
        self.foreign = bool(profile.foreign)
        self._hop_cache: dict = {}
        self._hop_time_cache: dict = {}
        measured = any(t in profile.tables for t in KERNEL_TABLES)
        # a GPU of a measured die takes that die's own curves (catalogue.first_principles_profile)
        die = "" if measured else str(profile.meta.get("same_die_as", ""))
        self.fitted = None if measured else shipped_fit(die)
        require(
            self.fitted is not None or not die,
            f"box {box.name}: same_die_as = {die!r} is not a GPU the roofline was fitted on (docs/roofline.md)",
        )
        self.roofline_source = PROVENANCE_FITTED if self.fitted else "roofline"
        self.collectives = Collectives(box, profile)

    # ---- primitive operations (per GPU) -------------------------------------------
    def roofline(self, nbytes: float, flops: float, dtype: str = "bf16", op: str = "memory") -> float:
        """A kernel's time from its bytes and flops: on a GPU with no measured kernel,
        the fitted efficiency curve of its operation class (roofline.py, docs/roofline.md),
        else the datasheet rates plus the profile's measured kernel floor."""
        gpu = self.box.gpu
        if self.fitted is not None:
            return self.fitted.seconds(op, nbytes, flops, gpu.mem_bw_bytes_s, gpu.flops(dtype))
        return max(nbytes / gpu.mem_bw_bytes_s, flops / gpu.flops(dtype)) + self.floor_s

    def gemm(self, m: int, n: int, k: int, dtype: WeightFormat | str) -> tuple[float, str]:
        """One GEMM [m x k] @ [k x n] with weights stored as `dtype`: the measured table
        of its kernel family, else the roofline at its bytes and tensor rate."""
        dtype = as_format(dtype)
        table = self.profile.gemm.get(dtype.kernel)
        if table is not None and m >= 1:
            ns, ks, curves = table
            total, ok, tags = 0.0, True, [grid_provenance(ns, n), grid_provenance(ks, k)]
            for i, wn in bracket(ns, n):
                for j, wk in bracket(ks, k):
                    curve = curves.get((ns[i], ks[j]))
                    if curve is None:
                        ok = False
                        break
                    total += wn * wk * curve(m) * 1e-3
                    tags.append(curve.provenance(m))
            if ok:
                return total, weakest(*tags)
        nbytes = n * k * dtype.bytes_per_param + ACT_BYTES * (m * k + m * n)
        return self.roofline(
            nbytes, 2.0 * m * n * k, dtype.compute, f"gemm_{dtype.compute}"
        ), self.roofline_source

    def moe(self, tokens: int, tp: int) -> tuple[float, str]:
        """Routed experts of one MoE layer for `tokens` tokens, split over `tp` ranks."""
        mo, m = self.model.moe, self.model
        assert mo is not None  # asked only of a MoE model's layers
        base = (m.expert_dtype.kernel, m.hidden, mo.moe_intermediate, mo.topk, mo.n_routed_experts, tp)
        experts, topk = mo.n_routed_experts, mo.topk

        def model_s(d: str) -> float:
            """The roofline at routing `d` (costs/routing.py: the distinct experts it touches)."""
            _, touched = busiest_rank(tokens, experts, topk, 1, d)
            nbytes = (
                touched * m.expert_params() * m.expert_dtype.bytes_per_param / tp
                + ACT_BYTES * tokens * m.hidden * 2
            )
            return self.roofline(nbytes, 2.0 * tokens * topk * m.expert_params() / tp, m.expert_dtype.compute)

        measured = routed_time(
            self.profile.tables.moe_by_routing, base, self.params.moe_distribution, tokens, model_s
        )
        if measured is not None:
            return measured
        touched = distinct_experts(tokens, mo.n_routed_experts, mo.topk)
        nbytes = (
            touched * m.expert_params() * m.expert_dtype.bytes_per_param / tp
            + ACT_BYTES * tokens * m.hidden * 2
        )
        flops = 2.0 * tokens * mo.topk * m.expert_params() / tp
        op = f"moe_{m.expert_dtype.kernel}"
        return self.roofline(nbytes, flops, m.expert_dtype.compute, op), self.roofline_source

    def attention_decode(self, batch: int, context: int, tp: int) -> tuple[float, str]:
        m = self.model
        if batch == 0:
            return 0.0, "measured"
        heads = m.heads // tp
        if m.mla:
            surface = self.profile.mla_decode.get((heads,))
            kv_elems = m.mla.kv_lora_rank + m.mla.qk_rope_head_dim
            flops = 2.0 * batch * heads * context * (kv_elems + m.mla.kv_lora_rank)
        else:
            surface = self.profile.gqa_decode.get((heads, max(m.kv_heads // tp, 1), m.head_dim))
            kv_elems = 2 * max(m.kv_heads // tp, 1) * m.head_dim
            flops = 4.0 * batch * heads * context * m.head_dim
        if surface is not None and m.kv_cache_dtype == "bf16":  # the tables hold a bf16 KV cache
            return surface(batch, max(context, 1)) * 1e-3, surface.provenance(batch, max(context, 1))
        nbytes = batch * context * kv_elems * m.kv_bytes_per_element
        return self.roofline(nbytes, flops, op="attention_decode"), self.roofline_source

    def attention_prefill(self, chunk: int, prefix: int, tp: int) -> tuple[float, str]:
        """Causal attention of a `chunk`-token chunk after `prefix` cached tokens.

        The table holds whole prompts (prefix 0). A chunk's causal work is
        chunk * (prefix + chunk / 2) query-key pairs, a whole prompt's of L tokens L^2 / 2:
        the chunk is read at the prompt length of equal work, sqrt(chunk (chunk + 2 prefix)),
        where the table's time already holds its kernel's fixed cost once (scaling the
        chunk's own time by its work ratio charged that cost 1 + 2 prefix / chunk times: a
        one-token chunk after 500 tokens at a thousand kernel launches). Never above the
        same tokens prefilled whole, prefix + chunk: that prompt does the chunk's work and more.
        """
        m = self.model
        heads = m.heads // tp
        surface = (
            self.profile.mla_prefill.get((heads,))
            if m.mla
            else self.profile.gqa_prefill.get((heads, max(m.kv_heads // tp, 1), m.head_dim))
        )
        if surface is not None:
            equal = math.sqrt(chunk * (chunk + 2.0 * prefix))
            at = min((equal, prefix + chunk), key=lambda isl: surface(1, isl))
            return surface(1, at) * 1e-3, surface.provenance(1, at)
        qk = (m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim + m.mla.v_head_dim) if m.mla else 2 * m.head_dim
        flops = 2.0 * heads * chunk * (prefix + chunk / 2.0) * qk
        nbytes = ACT_BYTES * chunk * m.hidden * 3 / tp
        return self.roofline(nbytes, flops, op="attention_prefill"), self.roofline_source

    def elementwise(self, tokens: int, width: int, passes: float = 2.0) -> tuple[float, str]:
        """A norm / activation / rope kernel: reads and writes `passes` x tokens x width."""
        return self.roofline(passes * tokens * width * ACT_BYTES, 0.0), self.roofline_source

    # ---- collectives and hops --------------------------------------------------------
    def collective(self, op: str, gpus: tuple[int, ...], nbytes: float) -> tuple[float, str]:
        """(seconds, provenance) of one collective over `gpus`: the measured table with its
        bandwidth part on this box's links, else NCCL's calibrated model (collectives.py)."""
        return self.collectives.time(op, gpus, nbytes)

    def ring_bw(self, gpus: tuple[int, ...]) -> float:
        """Bytes/s of the narrowest link of the TP ring over `gpus`: what a collective
        depends on besides the group size (one GPU: its memory)."""
        return ring_bw(self.box, gpus)

    def ring_hop_latency_s(self, gpus: tuple[int, ...]) -> float:
        """The slowest neighbour-to-neighbour latency of the ring over `gpus`."""
        box = self.box
        return max(
            sum(box.link(d).latency_s for d in box.path(a, b)) for a, b in zip(gpus, gpus[1:] + gpus[:1])
        )

    def allreduce_time(self, gpus: tuple[int, ...], nbytes: float) -> float:
        return self.collective("all_reduce", gpus, nbytes)[0]

    def hop_time(self, src_stage: int, dst_stage: int, nbytes: float) -> float:
        """Send `nbytes` of activations from one stage to another: each of the tp ranks
        sends 1/tp to its peer (transfers that share a link share its bandwidth), then
        the receiving ranks all-gather the pieces."""
        key = (src_stage, dst_stage, nbytes)
        hit = self._hop_time_cache.get(key)
        if hit is None:
            latency_s, s_per_byte = self._hop_path(src_stage, dst_stage)
            gather = (
                self.collective("all_gather", self.plan.stage_gpus(dst_stage), nbytes)[0]
                if self.plan.tp > 1
                else 0.0
            )
            hit = self._hop_time_cache[key] = (
                latency_s + nbytes * s_per_byte + gather + hop_cpu_s(self.params)
            )
        return hit

    def _hop_path(self, src_stage: int, dst_stage: int) -> tuple[float, float]:
        """(latency, seconds per byte of the whole hop) for a stage-to-stage hop: the
        slowest pair's latency, and the most loaded link's load / bandwidth."""
        key = (src_stage, dst_stage)
        hit = self._hop_cache.get(key)
        if hit is None:
            box, plan = self.box, self.plan
            load: dict = {}
            latency = 0.0
            for a, b in zip(plan.stage_gpus(src_stage), plan.stage_gpus(dst_stage)):
                path = box.path(a, b)
                latency = max(latency, sum(box.link(d).latency_s for d in path))
                for d in path:
                    load[d] = load.get(d, 0.0) + 1.0 / plan.tp
            per_byte = max((v / box.link(d).bw_bytes_s for d, v in load.items()), default=0.0)
            hit = self._hop_cache[key] = (latency, per_byte)
        return hit

    def hop_links(self, src_stage: int, dst_stage: int) -> tuple[LinkDir, ...]:
        links: set[LinkDir] = set()
        for a, b in zip(self.plan.stage_gpus(src_stage), self.plan.stage_gpus(dst_stage)):
            links.update(self.box.path(a, b))
        return tuple(sorted(links))

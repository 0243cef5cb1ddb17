"""The box: its GPUs and the PCIe (or NVLink) tree that joins them; a cluster of boxes.

A box is read from a TOML preset (pipesim/data/boxes, the format is docs/boxes.md) or
a user file. The tree is a list of links, each joining a child node to its parent; a
path between two GPUs goes up to their lowest common ancestor and down again. Each
link has a bandwidth per direction and a latency, so a transfer costs
sum(latency) + bytes / min(bandwidth). An NVSwitch is a node every GPU links to.

A cluster is N identical boxes joined by a network, one NIC per GPU (GPUDirect RDMA:
the NIC reads the GPU's memory directly). GPUs are numbered node-major: node k holds
GPUs k*G .. k*G+G-1. A transfer between nodes goes up the sender's NIC link and down
the receiver's, so it costs the network latency + bytes / NIC bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.checks import MAX_BOX_DEPTH, MAX_GPUS, parse_toml, read_text
from ..base.errors import UserError, require
from ..base.toml import toml_reader

if TYPE_CHECKING:
    from collections.abc import Iterable

NETWORK_NODE = "network"  # the fabric every NIC links to in a cluster


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: float
    mem_bw_bytes_s: float
    flops_bf16: float
    flops_fp8: float
    flops_fp4: float
    pcie_gen: int = 0  # 0 = not stated

    def flops(self, dtype: str) -> float:
        """Dense tensor rate of a GEMM's math (quantization.WeightFormat.compute):
        weight-only formats (int4, ...) dequantize to bf16 math; int8 tensor cores run
        at the fp8 rate (NVIDIA Hopper/Blackwell datasheets list INT8 TOPS = FP8 TFLOPS)."""
        return {
            "bf16": self.flops_bf16,
            "fp8": self.flops_fp8,
            "int8": self.flops_fp8,
            "fp4": self.flops_fp4,
        }.get(dtype, self.flops_bf16)


@dataclass(frozen=True)
class Link:
    child: str
    parent: str
    bw_bytes_s: float
    latency_s: float


@dataclass(frozen=True)
class Network:
    """What joins the boxes of a cluster: one NIC per GPU."""

    name: str
    nic_bw_bytes_s: float  # per GPU, per direction
    latency_s: float  # one message, NIC to NIC across the fabric


# A directed use of a link: (child, parent) going up, (parent, child) going down.
LinkDir = tuple[str, str]


@dataclass(frozen=True)
class Box:
    name: str
    description: str
    gpu: GPU
    gpu_count: int  # in the whole cluster
    links: tuple[Link, ...]
    nodes: int = 1
    network: Network | None = None
    interconnect: str = ""
    sources: tuple[tuple[str, str], ...] = ()  # (field, where its number comes from)
    aiconfigurator_system: str = ""  # AIConfigurator's name for this GPU's measured tables (catalogue.py)
    same_die_as: str = (
        ""  # the AIConfigurator system measured on this GPU's die (roofline curves fitted on it)
    )
    # why this box does not take its AIConfigurator system's measured collectives ("": it does):
    # they were measured on a chassis whose fabric is not this box's (catalogue.py)
    collectives_set_aside: str = ""

    @property
    def gpus_per_node(self) -> int:
        return self.gpu_count // self.nodes

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def spans_nodes(self, gpus: Iterable[int]) -> bool:
        return self.nodes > 1 and len({self.node_of(g) for g in gpus}) > 1

    # ---- the tree ---------------------------------------------------------------
    @cached_property
    def _parents(self) -> dict[str, Link]:
        return {link.child: link for link in self.links}

    @cached_property
    def _nics(self) -> dict[str, Link]:
        if self.nodes == 1 or self.network is None:
            return {}
        net = self.network
        # the network latency is split over the two NIC links a transfer crosses
        return {
            f"gpu{g}": Link(f"gpu{g}", NETWORK_NODE, net.nic_bw_bytes_s, net.latency_s / 2)
            for g in range(self.gpu_count)
        }

    def _ancestors(self, node: str) -> list[str]:
        parent, chain = self._parents, [node]
        while chain[-1] in parent:
            chain.append(parent[chain[-1]].parent)
        return chain

    def path(self, src_gpu: int, dst_gpu: int) -> tuple[LinkDir, ...]:
        """Directed links a transfer from one GPU to another crosses, in order."""
        if src_gpu == dst_gpu:
            return ()
        if self.nodes > 1 and self.node_of(src_gpu) != self.node_of(dst_gpu):
            return ((f"gpu{src_gpu}", NETWORK_NODE), (NETWORK_NODE, f"gpu{dst_gpu}"))
        up, down = self._ancestors(f"gpu{src_gpu}"), self._ancestors(f"gpu{dst_gpu}")
        below = {n: i for i, n in enumerate(down)}  # linear in the depth, not quadratic
        at = next((i for i, n in enumerate(up) if n in below), None)
        if at is None:
            raise UserError(f"box {self.name}: gpu{src_gpu} and gpu{dst_gpu} are not connected")
        hops_up = up[:at]
        hops_down = down[: below[up[at]]]
        parent = self._parents
        return tuple((n, parent[n].parent) for n in hops_up) + tuple(
            (parent[n].parent, n) for n in reversed(hops_down)
        )

    def link(self, d: LinkDir) -> Link:
        if NETWORK_NODE in d and self._nics:
            return self._nics[d[0] if d[1] == NETWORK_NODE else d[1]]
        parent = self._parents
        return parent[d[0]] if d[0] in parent and parent[d[0]].parent == d[1] else parent[d[1]]

    def p2p_time_s(self, src_gpu: int, dst_gpu: int, nbytes: float) -> float:
        """First-principles P2P cost: sum of link latencies + bytes / narrowest bandwidth."""
        hops = self.path(src_gpu, dst_gpu)
        if not hops:
            return 0.0
        links = [self.link(h) for h in hops]
        return sum(lk.latency_s for lk in links) + nbytes / min(lk.bw_bytes_s for lk in links)

    def ring_links(self, gpus: tuple[int, ...]) -> tuple[LinkDir, ...]:
        """Directed links a ring collective over `gpus` crosses (both ring directions)."""
        if len(gpus) < 2:
            return ()
        used: set[LinkDir] = set()
        for a, b in zip(gpus, gpus[1:] + gpus[:1]):
            used.update(self.path(a, b))
            used.update(self.path(b, a))
        return tuple(sorted(used))


def cluster(box: Box, nodes: int, network: Network | None = None) -> Box:
    """`nodes` copies of a one-node box joined by `network` (default: the box's own)."""
    require(
        isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1,
        f"--nodes must be a whole number >= 1, got {nodes}",
    )
    require(box.nodes == 1, f"box {box.name} is already a cluster of {box.nodes} nodes")
    net = network or box.network
    if nodes == 1:
        return box if net is box.network else replace(box, network=net)
    if net is None:
        raise UserError(
            f"box {box.name} has no [network] section; give one with --network "
            f"({', '.join(network_names())}) to join {nodes} nodes"
        )
    g = box.gpu_count
    require(g * nodes <= MAX_GPUS, f"--nodes {nodes} makes {g * nodes} GPUs, above the limit of {MAX_GPUS}")

    def rename(node: str, k: int) -> str:
        if node.startswith("gpu") and node[3:].isdigit():
            return f"gpu{k * g + int(node[3:])}"
        return f"n{k}.{node}"

    links = tuple(
        Link(rename(lk.child, k), rename(lk.parent, k), lk.bw_bytes_s, lk.latency_s)
        for k in range(nodes)
        for lk in box.links
    )
    return replace(
        box,
        name=f"{box.name} x {nodes} nodes",
        gpu_count=g * nodes,
        links=links,
        nodes=nodes,
        network=net,
        description=f"{nodes} x ({box.description}), joined by {net.name}",
    )


# ---- networks --------------------------------------------------------------------------------


def _network_table() -> dict:
    text = resources.files("pipesim.data").joinpath("networks.toml").read_text()
    return toml_reader.loads(text)


def network_names() -> list[str]:
    return sorted(_network_table())


def load_network(name: str) -> Network:
    table = _network_table()
    require(name in table, f"unknown network '{name}'; known: {', '.join(sorted(table))}")
    return network_from_dict(table[name], f"network {name}")


def network_from_dict(d: dict, origin: str) -> Network:
    require(isinstance(d, dict), f"{origin}: [network] must be a table with name, nic_gb_s, latency_us")
    for key in ("nic_gb_s", "latency_us"):
        require(key in d, f"{origin}: missing field network.{key}")
    bw = _number(d["nic_gb_s"], f"{origin}: network.nic_gb_s", positive=True)
    lat = _number(d["latency_us"], f"{origin}: network.latency_us", positive=False)
    return Network(str(d.get("name", origin)), bw * 1e9, lat * 1e-6)


# ---- loading and validation --------------------------------------------------------------------


def box_names() -> list[str]:
    folder = resources.files("pipesim.data").joinpath("boxes")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_box(name_or_path: str | Path, nodes: int = 1, network: str | None = None) -> Box:
    """A preset name (see `box_names()`) or the path of a box TOML file; `nodes` > 1
    makes a cluster of that many boxes joined by `network` (a name in
    `network_names()`, default the box's own [network])."""
    text = str(name_or_path)
    if text in box_names():
        raw = resources.files("pipesim.data").joinpath("boxes").joinpath(f"{text}.toml").read_text()
        origin = f"preset {text}"
    else:
        path = Path(text)
        require(
            path.suffix == ".toml" and path.is_file(),
            f"unknown box '{text}'; known presets: {', '.join(box_names())}, or the path of a box .toml file",
        )
        raw, origin = read_text(path, "box"), str(path)
    data = parse_toml(raw, f"box {origin}")
    box = box_from_dict(data, origin)
    if nodes != 1 or network is not None:
        box = cluster(box, nodes, load_network(network) if network is not None else None)
    return box


def _number(value: object, what: str, positive: bool = True) -> float:
    """A finite number (not a bool or a string); > 0 when `positive`, else >= 0."""
    if not (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    ):
        raise UserError(f"{what} = {value!r} must be a finite number {'> 0' if positive else '>= 0'}")
    return float(value)


def _text(d: dict, key: str, what: str, default: str | None = None) -> str:
    value = d.get(key, default)
    if not isinstance(value, str):
        raise UserError(f"{what}.{key} must be a string, got {value!r}")
    return value


def box_from_dict(data: dict, origin: str = "box") -> Box:
    """Validate a box read from TOML: types, positive finite numbers, a tree (every
    child has one parent, no cycle) that reaches every GPU; then build it."""
    where = f"box {origin}"
    g = data.get("gpu")
    if not isinstance(g, dict):
        raise UserError(f"{where}: missing [gpu] section")
    for key in ("name", "count", "memory_bytes", "mem_bw_bytes_s", "flops_bf16"):
        require(key in g, f"{where}: missing field gpu.{key}")
    count = g["count"]
    require(
        isinstance(count, int) and not isinstance(count, bool) and count >= 1,
        f"{where}: gpu.count = {count!r} must be a whole number >= 1",
    )
    require(count <= MAX_GPUS, f"{where}: gpu.count = {count} is above the limit of {MAX_GPUS}")
    num = {k: _number(g[k], f"{where}: gpu.{k}") for k in ("memory_bytes", "mem_bw_bytes_s", "flops_bf16")}
    fp8 = _number(g.get("flops_fp8", num["flops_bf16"]), f"{where}: gpu.flops_fp8")
    fp4 = _number(g.get("flops_fp4", fp8), f"{where}: gpu.flops_fp4")
    pcie = g.get("pcie_gen", 0)
    require(
        isinstance(pcie, int) and not isinstance(pcie, bool) and 0 <= pcie <= 7,
        f"{where}: gpu.pcie_gen = {pcie!r} must be a whole number 0-7 (0 = not stated)",
    )
    gpu = GPU(
        _text(g, "name", f"{where}: gpu"),
        num["memory_bytes"],
        num["mem_bw_bytes_s"],
        num["flops_bf16"],
        fp8,
        fp4,
        pcie,
    )

    topo = data.get("topology", {})
    require(isinstance(topo, dict), f"{where}: [topology] must be a table holding links = [...]")
    raw_links = topo.get("links", [])
    require(isinstance(raw_links, list), f"{where}: topology.links must be a list of links")
    links = []
    for i, lk in enumerate(raw_links):
        what = f"{where}: link {i + 1}"
        require(isinstance(lk, dict), f"{what} must be a table {{child, parent, bw_gb_s, latency_us}}")
        for key in ("child", "parent", "bw_gb_s", "latency_us"):
            require(key in lk, f"{what}: missing field {key}")
        child, parent = _text(lk, "child", what), _text(lk, "parent", what)
        require(child != parent, f"{what}: {child} cannot be its own parent")
        require(
            child != NETWORK_NODE and parent != NETWORK_NODE,
            f"{what}: '{NETWORK_NODE}' is reserved for the cluster network",
        )
        links.append(
            Link(
                child,
                parent,
                _number(lk["bw_gb_s"], f"{what} ({child}-{parent}) bw_gb_s") * 1e9,
                _number(lk["latency_us"], f"{what} ({child}-{parent}) latency_us", positive=False) * 1e-6,
            )
        )
    parents: dict[str, str] = {}
    for lk in links:
        require(
            lk.child not in parents,
            f"{where}: {lk.child} has two parents ({parents.get(lk.child)} and {lk.parent}); "
            "the topology must be a tree, each node linked once to its parent",
        )
        parents[lk.child] = lk.parent
    # walk up from every node, each node walked once (linear in the links, whatever the
    # depth): a repeat within one walk is a cycle; a node's depth is its parent's + 1
    depth: dict[str, int] = {}
    for node in parents:
        walk: list[str] = []
        on_walk: set[str] = set()
        n = node
        while n in parents and n not in depth:
            if n in on_walk:
                cycle = walk[walk.index(n) :] + [n]
                raise UserError(
                    f"{where}: the links form a cycle ({' -> '.join(cycle)}); the topology must be a tree"
                )
            walk.append(n)
            on_walk.add(n)
            n = parents[n]
        d = depth.get(n, 0)
        for m in reversed(walk):
            d += 1
            depth[m] = d
        require(
            d <= MAX_BOX_DEPTH,
            f"{where}: {node} is {d} links below the top of the tree, above the limit of {MAX_BOX_DEPTH} "
            "(a box's GPUs meet within a few switch levels)",
        )
    for name in set(parents) | set(parents.values()):
        if name.startswith("gpu") and name[3:].isdigit():
            require(
                int(name[3:]) < count,
                f"{where}: link names {name}, but gpu.count = {count} (gpu0..gpu{count - 1})",
            )

    net = network_from_dict(data["network"], where) if "network" in data else None
    sources = data.get("sources", {})
    require(
        isinstance(sources, dict) and all(isinstance(v, str) for v in sources.values()),
        f"{where}: [sources] must map field names to strings",
    )
    box = Box(
        _text(data, "name", where, origin),
        _text(data, "description", where, ""),
        gpu,
        count,
        tuple(links),
        network=net,
        interconnect=_text(data, "interconnect", where, ""),
        sources=tuple((str(k), v) for k, v in sources.items()),
        aiconfigurator_system=_text(data, "aiconfigurator_system", where, ""),
        same_die_as=_text(data, "same_die_as", where, ""),
        collectives_set_aside=_text(data, "aiconfigurator_collectives_set_aside", where, ""),
    )
    for i in range(1, count):  # every GPU must be reachable from gpu0
        up, down = box._ancestors("gpu0"), box._ancestors(f"gpu{i}")
        require(
            any(n in down for n in up),
            f"{where}: gpu{i} is not connected to gpu0 "
            f"(gpu0 reaches {up[-1]}, gpu{i} reaches {down[-1]}); every GPU must be in one tree",
        )
    return box

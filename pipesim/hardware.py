"""The box: its GPUs and the PCIe (or NVLink) tree that joins them.

A box is read from a TOML preset (pipesim/data/boxes) or a user file. The tree is a
list of links, each joining a child node to its parent; a path between two GPUs goes
up to their lowest common ancestor and down again. Each link has a bandwidth per
direction and a latency, so a transfer costs sum(latency) + bytes / min(bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

from ._toml import toml_reader
from .errors import UserError, require


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: float
    mem_bw_bytes_s: float
    flops_bf16: float
    flops_fp8: float
    flops_fp4: float

    def flops(self, dtype: str) -> float:
        """Dense tensor rate for a weight dtype (int4 weights are dequantized to bf16 math)."""
        return {"bf16": self.flops_bf16, "fp8": self.flops_fp8, "int4": self.flops_bf16}.get(dtype, self.flops_bf16)


@dataclass(frozen=True)
class Link:
    child: str
    parent: str
    bw_bytes_s: float
    latency_s: float


# A directed use of a link: (child, parent) going up, (parent, child) going down.
LinkDir = tuple[str, str]


@dataclass(frozen=True)
class Box:
    name: str
    description: str
    gpu: GPU
    gpu_count: int
    links: tuple[Link, ...]

    # ---- the tree ---------------------------------------------------------------
    @cached_property
    def _parents(self) -> dict[str, Link]:
        return {link.child: link for link in self.links}

    def _ancestors(self, node: str) -> list[str]:
        parent, chain = self._parents, [node]
        while chain[-1] in parent:
            chain.append(parent[chain[-1]].parent)
        return chain

    def path(self, src_gpu: int, dst_gpu: int) -> tuple[LinkDir, ...]:
        """Directed links a transfer from one GPU to another crosses, in order."""
        if src_gpu == dst_gpu:
            return ()
        up, down = self._ancestors(f"gpu{src_gpu}"), self._ancestors(f"gpu{dst_gpu}")
        common = next((n for n in up if n in down), None)
        require(common is not None, f"box {self.name}: gpu{src_gpu} and gpu{dst_gpu} are not connected")
        hops_up = up[: up.index(common)]
        hops_down = down[: down.index(common)]
        parent = self._parents
        return tuple((n, parent[n].parent) for n in hops_up) + tuple(
            (parent[n].parent, n) for n in reversed(hops_down))

    def link(self, d: LinkDir) -> Link:
        parent = self._parents
        return parent[d[0]] if d[0] in parent and parent[d[0]].parent == d[1] else parent[d[1]]

    def p2p_time_s(self, src_gpu: int, dst_gpu: int, nbytes: float) -> float:
        """First-principles P2P cost: sum of link latencies + bytes / narrowest bandwidth."""
        hops = self.path(src_gpu, dst_gpu)
        if not hops:
            return 0.0
        links = [self.link(h) for h in hops]
        return sum(l.latency_s for l in links) + nbytes / min(l.bw_bytes_s for l in links)

    def ring_links(self, gpus: tuple[int, ...]) -> tuple[LinkDir, ...]:
        """Directed links a ring collective over `gpus` crosses (both ring directions)."""
        if len(gpus) < 2:
            return ()
        used: set[LinkDir] = set()
        for a, b in zip(gpus, gpus[1:] + gpus[:1]):
            used.update(self.path(a, b))
            used.update(self.path(b, a))
        return tuple(sorted(used))


def box_names() -> list[str]:
    folder = resources.files("pipesim.data").joinpath("boxes")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_box(name_or_path: str | Path) -> Box:
    """A preset name (see `box_names()`) or the path of a box TOML file."""
    text = str(name_or_path)
    if text in box_names():
        raw = resources.files("pipesim.data").joinpath("boxes").joinpath(f"{text}.toml").read_text()
        origin = f"preset {text}"
    else:
        path = Path(text)
        require(path.suffix == ".toml" and path.is_file(),
                f"unknown box '{text}'; known presets: {', '.join(box_names())}, or the path of a box .toml file")
        raw, origin = path.read_text(), str(path)
    try:
        data = toml_reader.loads(raw)
    except toml_reader.TOMLDecodeError as exc:
        raise UserError(f"box {origin}: not valid TOML: {exc}") from None
    return box_from_dict(data, origin)


def box_from_dict(data: dict, origin: str = "box") -> Box:
    try:
        g = data["gpu"]
        gpu = GPU(str(g["name"]), float(g["memory_bytes"]), float(g["mem_bw_bytes_s"]),
                  float(g["flops_bf16"]), float(g.get("flops_fp8", g["flops_bf16"])),
                  float(g.get("flops_fp4", g.get("flops_fp8", g["flops_bf16"]))))
        count = int(g["count"])
        links = tuple(Link(str(l["child"]), str(l["parent"]), float(l["bw_gb_s"]) * 1e9, float(l["latency_us"]) * 1e-6)
                      for l in data.get("topology", {}).get("links", []))
    except KeyError as exc:
        raise UserError(f"box {origin}: missing field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"box {origin}: bad value ({exc})") from None
    for field in ("memory_bytes", "mem_bw_bytes_s", "flops_bf16", "flops_fp8", "flops_fp4"):
        require(getattr(gpu, field) > 0, f"box {origin}: gpu.{field} must be positive")
    require(count >= 1, f"box {origin}: gpu.count must be at least 1")
    for l in links:
        require(l.bw_bytes_s > 0 and l.latency_s >= 0, f"box {origin}: link {l.child}-{l.parent} needs bw > 0, latency >= 0")
    box = Box(str(data.get("name", origin)), str(data.get("description", "")), gpu, count, links)
    if count > 1:
        for i in range(1, count):
            box.path(0, i)  # every GPU must be reachable
    return box

"""The box for people: one line per preset (`pipesim boxes list`) and every number with its
source and the topology tree (`pipesim boxes show`)."""

from __future__ import annotations

from .box import Box, Link


def summary_line(name: str, box: Box) -> str:
    """One line of `pipesim boxes list`: name, GPUs, GPU model, memory, interconnect."""
    return (
        f"{name:<28} {box.gpu_count:>2} x {box.gpu.name:<50} {box.gpu.memory_bytes / 2**30:6.1f} GiB  "
        f"{box.interconnect or '-'}"
    )


def _tree_lines(box: Box) -> list[str]:
    children: dict[str, list[Link]] = {}
    for link in box.links:
        children.setdefault(link.parent, []).append(link)
    roots = sorted({lk.parent for lk in box.links} - {lk.child for lk in box.links})
    lines: list[str] = []

    def walk(node: str, depth: int) -> None:
        for link in children.get(node, []):
            lines.append(
                f"{'  ' * (depth + 2)}{link.child} -> {node}: {link.bw_bytes_s / 1e9:g} GB/s per direction, "
                f"{link.latency_s * 1e6:g} us"
            )
            walk(link.child, depth + 1)

    for root in roots:
        lines.append(f"  {root}")
        walk(root, 0)
    return lines or ["  (no links: one GPU)"]


def details(box: Box) -> list[str]:
    """Every field of a box, each with its source, and the topology tree."""
    g, src = box.gpu, dict(box.sources)
    rows = [
        ("name", box.name, None),
        ("description", box.description, None),
        ("interconnect", box.interconnect, None),
        ("gpu", f"{box.gpu_count} x {g.name}" + (f", PCIe Gen{g.pcie_gen}" if g.pcie_gen else ""), None),
        ("memory_bytes", f"{g.memory_bytes:.0f} ({g.memory_bytes / 2**30:.1f} GiB)", "memory_bytes"),
        ("mem_bw_bytes_s", f"{g.mem_bw_bytes_s / 1e12:g} TB/s", "mem_bw_bytes_s"),
        (
            "flops_bf16 / fp8 / fp4",
            f"{g.flops_bf16 / 1e12:g} / {g.flops_fp8 / 1e12:g} / {g.flops_fp4 / 1e12:g} TFLOPS dense",
            "flops",
        ),
    ]
    lines = []
    for label, value, key in rows:
        lines.append(f"{label:<24} {value}")
        if key:
            lines.append(f"{'':<26}source: {src.get(key, 'not given')}")
    lines.append("topology (child -> parent)")
    lines += _tree_lines(box)
    lines.append(f"{'':<26}source: {src.get('topology', 'not given')}")
    net = box.network
    lines.append(
        f"{'network':<24} "
        + (
            f"{net.name}: {net.nic_bw_bytes_s / 1e9:g} GB/s per GPU per direction, {net.latency_s * 1e6:g} us"
            if net
            else "none given (use --network with --nodes)"
        )
    )
    if net:
        lines.append(f"{'':<26}source: {src.get('network', 'not given')}")
    return lines

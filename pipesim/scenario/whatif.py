"""What-ifs: change one physical cost of a scenario and predict again.

Each knob changes what the profile or box says, never the simulator:

- `kernel_scale`: every kernel (GEMMs, attention, MoE, norms) takes this many times
  its calibrated time (0.5: a GPU twice as fast at the same memory and links);
- `allreduce_scale`: every TP collective takes this many times its calibrated time
  (the profile's own `allreduce_scale` and offset stay in force under it);
- `pcie_bandwidth_scale`: every link of the box (PCIe switches, root ports, socket
  links, NVLink) carries this many times its bandwidth; it speeds PP hops and the
  bandwidth part of every collective, a measured table's too (its time beyond the
  latency fitted to it, costs/collectives.py: such a value is tagged `scaled`), not
  the latency part (`allreduce_scale` scales a whole all-reduce);
- `cpu_iteration_ms`: extra scheduler CPU time per loop iteration, set outright (on top
  of the engine's host loop, costs/host.py).

`pipesim.predict(..., kernel_scale=0.5)` and the same flags on the command line
(`--kernel-scale 0.5`) take them; `pipesim.whatif(base, **changes)` (api.py) predicts a
base scenario and its changed copy side by side.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..base.errors import require

if TYPE_CHECKING:
    from ..inputs.box import Box
    from ..profiles.profile import Profile

KNOBS = ("kernel_scale", "allreduce_scale", "pcie_bandwidth_scale", "cpu_iteration_ms")


def check(changes: dict) -> dict:
    """The given what-if knobs (None: unchanged), each a finite number: scales > 0,
    the CPU time >= 0."""
    out = {}
    for k, v in changes.items():
        if v is None:
            continue
        require(k in KNOBS, f"unknown what-if '{k}'; allowed: {', '.join(KNOBS)}")
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v != float("inf")
        low = v >= 0 if k == "cpu_iteration_ms" else ok and v > 0
        require(
            ok and low,
            f"--{k.replace('_', '-')} must be a finite number {'>= 0' if k == 'cpu_iteration_ms' else '> 0'}, "
            f"got {v!r}",
        )
        out[k] = float(v)
    return out


def apply_profile(profile: Profile, changes: dict) -> Profile:
    """The profile with the kernel / all-reduce scales multiplied and the CPU time set."""
    p = profile.params
    values = {}
    if "kernel_scale" in changes:
        values["kernel_scale"] = p.kernel_scale * changes["kernel_scale"]
    if "allreduce_scale" in changes:
        values["allreduce_scale"] = p.allreduce_scale * changes["allreduce_scale"]
    if "cpu_iteration_ms" in changes:
        values["cpu_iteration_ms"] = changes["cpu_iteration_ms"]
    return profile.with_params(**values) if values else profile


def apply_box(box: Box, changes: dict) -> Box:
    """The box with every link's bandwidth scaled."""
    scale = changes.get("pcie_bandwidth_scale")
    if scale is None:
        return box
    return replace(box, links=tuple(replace(link, bw_bytes_s=link.bw_bytes_s * scale) for link in box.links))

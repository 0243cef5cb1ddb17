"""Where each cost came from, weighed by how much of the run it priced.

Every operation time carries its provenance (`PROVENANCE`): read at a measured point,
interpolated between points, extrapolated outside the table's range, scaled (a measured
collective with its bandwidth part moved to this box's links, collectives.py), estimated by the
roofline (its datasheet form, or the efficiency curves fitted on measured GPUs), or
borrowed (read from a profile measured on another box, GPU or engine, run with
--allow-foreign-profile). A `Ledger` keeps, per cached cost (a stage's time for a
micro-batch shape, a data-parallel step's part), its seconds by provenance and how
many times the run used it; `shares` weighs them over every micro-batch computed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING

from ..profiles.curves import TABLE_PROVENANCE
from .collectives import SCALED
from .roofline import PROVENANCE_FITTED

if TYPE_CHECKING:
    from .primitives import Op

PROVENANCE = TABLE_PROVENANCE + (SCALED, "roofline", PROVENANCE_FITTED, "borrowed")


def summed(ops: Iterable[Op], kernel_scale: float) -> tuple[float, float, dict[str, float]]:
    """(compute seconds, communication seconds, seconds by provenance) of `ops`, the
    compute scaled by the profile's kernel_scale (a what-if on kernels, not links)."""
    compute = comm = 0.0
    by_source: dict[str, float] = {}
    for o in ops:
        seconds = o.seconds * o.count
        if o.kind == "compute":
            compute += seconds
            seconds *= kernel_scale
        else:
            comm += seconds
        by_source[o.source] = by_source.get(o.source, 0.0) + seconds
    return compute * kernel_scale, comm, by_source


class Ledger:
    """Seconds by provenance of each cached cost, and its uses in the run."""

    def __init__(self) -> None:
        self._sources: dict[Hashable, dict[str, float]] = {}  # cost key -> {provenance: seconds}
        self._uses: dict[Hashable, int] = {}  # cost key -> micro-batches it priced

    def enter(self, key: Hashable, by_source: dict[str, float]) -> None:
        """The seconds by provenance of the cost cached under `key`."""
        self._sources[key] = by_source

    def use(self, key: Hashable) -> None:
        """The run priced one more micro-batch (or step) with the cost under `key`."""
        self._uses[key] = self._uses.get(key, 0) + 1

    def shares(self) -> dict[str, float]:
        """Share of the operation time of every use so far, by provenance; all zeros
        before any."""
        total = dict.fromkeys(PROVENANCE, 0.0)
        for key, uses in self._uses.items():
            for source, seconds in self._sources[key].items():
                total[source] += seconds * uses
        whole = sum(total.values())
        return {k: (v / whole if whole else 0.0) for k, v in total.items()}

"""Metrics accumulated as the run goes: a run's busy intervals, launched batches and
returned tokens folded into running figures over its measurement window, one stretch
of simulated time at a time, so that a run's memory does not grow with its length.

The simulation appends rows to its Recorder (record.py): per stage its compute and TP
collectives, per PP hop its transfers, the scheduler CPU, waits for shared links,
launched batches, token returns and KV evictions. `StepTally.fold(rows, now, ...)`
turns the rows up to simulated time `now` into running figures:

- busy seconds (each row's length inside the window, overlaps counted each time:
  `busy_in`) and covered seconds (the length of the union: `covered_s`) per stage, hop,
  the scheduler CPU and link waits;
- each stage's idle stretches (the gaps between its busy stretches), counted and summed,
  and its idle time split by what was in flight towards it (metrics.idle_breakdown);
- launched batches (mean size, decode batch per slot, vLLM's in-flight groups), the
  batches in flight by position over time (occupancy.py), output tokens, KV evictions.

Folding is exact, not an estimate. Every row is appended at or before its start (the
pipeline books work ahead of its time, never behind it: pipeline.py), so once the run is
at `now` no row still to come touches the time before `now`. Every figure adds up over
disjoint stretches of time: a row that crosses a cut counts its part on each side, and an
idle stretch cut in two is carried across and counted once. So the figures of the window
are the same wherever the cuts fall. A run that keeps every row (record="full": the
trace) folds once, at the end, and gets the same figures (tests/test_tally.py).

Every row counts for its part inside the window [warm-up end, stop]: a stage still
computing when the run stops was busy up to the stop.
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from .occupancy import Occupancy
from .rows import HOST_PARTS, Recorder, upto
from .steady import TimeHistogram

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypeAlias

    # [(start, end)]: a list of pairs or an (n, 2) array
    Intervals: TypeAlias = Sequence[Sequence[float]] | np.ndarray

# Gaps shorter than this are float noise between touching intervals, not bubbles.
BUBBLE_MIN_S = 1e-9
# A summary run folds its rows once this many token returns have piled up (a few
# milliseconds of numpy per fold; the rows held stay a few hundred kilobytes).
FOLD_RETURNS = 4096


# ---- interval arithmetic (one clipping rule for every figure) ----------------------


def rows_array(intervals: Intervals) -> np.ndarray:
    """[(start, end)] as an (n, 2) float array (a list of pairs read flat: several
    times faster than np.asarray on a list of tuples)."""
    if isinstance(intervals, list):
        flat = np.fromiter(chain.from_iterable(intervals), dtype=float, count=2 * len(intervals))
        return flat.reshape(-1, 2)
    return np.asarray(intervals, dtype=float).reshape(-1, 2)


def _clipped(intervals: Intervals, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of [(start, end)] clipped to [t0, t1] (empty ones keep end <= start)."""
    a = rows_array(intervals)
    return np.maximum(a[:, 0], t0), np.minimum(a[:, 1], t1)


def busy_in(intervals: Intervals, t0: float, t1: float) -> float:
    """Seconds of `intervals` inside [t0, t1], overlaps counted each time (a resource
    busy twice at once, e.g. two transfers waiting, counts both)."""
    if len(intervals) == 0:
        return 0.0
    start, end = _clipped(intervals, t0, t1)
    return float(np.clip(end - start, 0.0, None).sum())


def merge(intervals: Intervals, t0: float = -np.inf, t1: float = np.inf) -> np.ndarray:
    """The union of [(start, end)] clipped to [t0, t1], as sorted disjoint rows.
    Touching intervals merge (compute then its all-reduce is one busy stretch)."""
    start, end = _clipped(intervals, t0, t1)
    a = np.column_stack((start, end))
    a = a[a[:, 1] > a[:, 0]]
    if not len(a):
        return a
    a = a[np.argsort(a[:, 0], kind="stable")]
    reach = np.maximum.accumulate(a[:, 1])
    new = np.concatenate(([True], a[1:, 0] > reach[:-1]))
    starts = a[new, 0]
    ends = reach[np.concatenate((np.flatnonzero(new)[1:] - 1, [len(a) - 1]))]
    return np.column_stack((starts, ends))


def covered_s(intervals: Intervals, t0: float, t1: float) -> float:
    """Seconds of [t0, t1] covered by at least one of `intervals` (overlaps once)."""
    m = merge(intervals, t0, t1)
    return float((m[:, 1] - m[:, 0]).sum())


def gaps(busy: np.ndarray, t0: float, t1: float, min_s: float = BUBBLE_MIN_S) -> np.ndarray:
    """Idle stretches of [t0, t1] between merged busy rows, longer than `min_s`."""
    edges = np.concatenate(([t0], busy.ravel(), [t1])).reshape(-1, 2)
    return edges[edges[:, 1] - edges[:, 0] > min_s]


# ---- vLLM's in-flight groups -----------------------------------------------------


class InflightGroups:
    """vLLM's in-flight groups at each launch: the requests of every batch in flight
    then (launched, not yet returned), largest first, padded with zeros to
    max_concurrent_batches. vLLM has no slots; a decoding request stays with the batch
    it was scheduled with, so these are its groups (docs/engines.md §6). Batches return
    in launch order (one pipeline), so the i-th token return is the i-th batch's.
    Fed returns and launches in time order (a return before the launches at or after
    it); holds only the batches in flight."""

    def __init__(self, groups: int) -> None:
        self.groups = groups
        self._returns: deque[float] = deque()  # return times of the batches in flight, in order
        self._inflight: deque[int] = deque()  # their sizes, launch order
        self.sums = [0.0] * groups  # over the launches sampled: sizes of each group, summed
        self.samples = 0

    def returned(self, t_s: float) -> None:
        self._returns.append(t_s)

    def launch(self, t_s: float, size: int, sample: bool) -> list[int]:
        """The sizes in flight at a launch at `t_s` (this batch included), largest first;
        added to the window's sums when `sample`."""
        inflight, returns = self._inflight, self._returns
        while inflight and returns and returns[0] <= t_s:
            inflight.popleft()
            returns.popleft()
        inflight.append(size)
        n = self.groups
        sizes = sorted(inflight, reverse=True)[:n]
        sizes += [0] * (n - len(sizes))
        if sample:
            self.samples += 1
            for k, v in enumerate(sizes):
                self.sums[k] += v
        return sizes

    def means(self) -> list[float]:
        """Mean size of each group over the launches sampled (zeros if none)."""
        return [s / self.samples if self.samples else 0.0 for s in self.sums]


# ---- the running figures -----------------------------------------------------------


class StepTally:
    """Running figures of a run's rows over its measurement window (the module
    docstring). Rows are per stage (or per DP rank); the hop feeding stage s is the hop
    out of stage s - 1 (none without PP: those lists stay empty); the scheduler CPU
    runs on stage 0's host. The batches in flight are taken by position (occupancy.py),
    one per slot or, with vLLM's groups, one per group; not for the rows of DP ranks
    (more rows than slots and no groups), whose returns interleave."""

    def __init__(
        self, stages: int, slots: int, groups: int = 0, open_loop: bool = True, positions: int | None = None
    ) -> None:
        self.stages, self.slots = stages, slots
        self.cut_s = 0.0  # rows before this time are folded
        self.window_s: tuple[float, float] | None = None  # set by the last fold
        zeros = [0.0] * stages
        self.compute_s, self.comm_s = list(zeros), list(zeros)  # busy seconds per stage
        # covered seconds per stage: compute, collectives, both, + the hop in, + the CPU
        self.covered = [[0.0] * 5 for _ in range(stages)]
        self.bubbles, self.bubble_s = [0] * stages, list(zeros)
        self._open_idle_s = list(zeros)  # an idle stretch running into the next stretch
        self.hop_s = list(zeros)  # busy seconds of the hop out of each stage
        self.cpu_s = self.link_wait_s = 0.0
        self.host_s: dict[str, float] = dict.fromkeys(HOST_PARTS, 0.0)  # busy seconds by host part
        self.tokens = 0.0  # output tokens returned in the window
        # ... and when: an open loop's batch means (a closed loop's come from its requests)
        self.token_times = TimeHistogram() if open_loop else None
        self.batches = self.batch_requests = self.decode_batches = self.decode_requests = 0
        self.slot_decode, self.slot_decode_batches = [0] * slots, [0] * slots
        self.groups = InflightGroups(groups) if groups else None
        # positions: the most batches in flight at once (default: a group or a slot each)
        positions = positions if positions is not None else (groups or slots)
        self.occupancy = Occupancy(positions) if groups or slots >= stages else None
        self.evictions = self.evictions_total = 0
        self.visits = 0  # stage visits (compute rows) of the whole run

    def fold(self, rows: Recorder, now_s: float, window_start_s: float | None, final: bool = False) -> None:
        """Fold the rows of [cut, now_s) into the figures; with `final`, of [cut, now_s]
        (the run stops at now_s). `window_start_s` is the window's start, None while the
        warm-up runs (it then lies at or after now_s: this stretch is outside the window).
        The rows are only read: record.fold lets go of them after (Recorder.drop_before),
        so every stage visit is counted once, when its row ends by the cut."""
        a, b, t0 = self.cut_s, now_s, window_start_s
        lo = b if t0 is None else max(a, t0)  # the part of [a, b) inside the window
        if lo < b:
            self._intervals(rows, lo, b, final)
        elif final:
            self._close_idle()
        self._points(rows, b, t0, final)
        if final:
            self.visits += sum(len(r) for r in rows.compute)
            self.window_s = (b if t0 is None else t0, b)
        else:
            self.visits += sum(1 for stage in rows.compute for r in stage if r[1] <= b)
        self.cut_s = b

    def _intervals(self, rec: Recorder, lo: float, hi: float, final: bool) -> None:
        """Busy and covered seconds of [lo, hi); idle stretches carried across cuts."""
        n = self.stages
        cpu = rows_array(rec.cpu)
        self.cpu_s += busy_in(cpu, lo, hi)
        self.link_wait_s += busy_in(rec.link_wait, lo, hi)
        for part, rows in rec.host.items():
            if rows:
                self.host_s[part] += busy_in(rows, lo, hi)
        hops = [rows_array(h) for h in rec.hops]
        for s in range(n):
            self.hop_s[s] += busy_in(hops[s], lo, hi)
        for s in range(n):
            c, m = rows_array(rec.compute[s]), rows_array(rec.comm[s])
            self.compute_s[s] += busy_in(c, lo, hi)
            self.comm_s[s] += busy_in(m, lo, hi)
            busy = np.concatenate((c, m))
            with_hop = np.concatenate((busy, hops[(s - 1) % n])) if n > 1 else busy
            with_cpu = np.concatenate((with_hop, cpu)) if s == 0 else with_hop
            merged = merge(busy, lo, hi)
            cov = self.covered[s]
            cov[0] += covered_s(c, lo, hi)
            cov[1] += covered_s(m, lo, hi)
            cov[2] += float((merged[:, 1] - merged[:, 0]).sum())
            cov[3] += covered_s(with_hop, lo, hi)
            cov[4] += covered_s(with_cpu, lo, hi)
            self._idle(s, gaps(merged, lo, hi, min_s=0.0), lo, hi, final)

    def _idle(self, s: int, idle: np.ndarray, lo: float, hi: float, final: bool) -> None:
        """Count stage s's idle stretches of [lo, hi): one that starts at `lo` continues
        the stretch carried from the last cut (else that one ended there); one that ends
        at `hi` is carried on, unless the run ends there."""
        lengths = [float(x) for x in idle[:, 1] - idle[:, 0]]
        carried, self._open_idle_s[s] = self._open_idle_s[s], 0.0
        if len(idle) and idle[0, 0] == lo:
            lengths[0] += carried
        elif carried:
            lengths.insert(0, carried)
        if len(idle) and idle[-1, 1] == hi and not final:
            self._open_idle_s[s] = lengths.pop()
        self._count_idle(s, lengths)

    def _close_idle(self) -> None:
        for s in range(self.stages):
            carried, self._open_idle_s[s] = self._open_idle_s[s], 0.0
            self._count_idle(s, [carried])

    def _count_idle(self, s: int, lengths: list[float]) -> None:
        for x in lengths:
            if x > BUBBLE_MIN_S:
                self.bubbles[s] += 1
                self.bubble_s[s] += x

    def _points(self, rec: Recorder, b: float, t0: float | None, final: bool) -> None:
        """Token returns, launched batches and evictions before `b` (all if final):
        tokens and evictions count in the window (t0, stop], batches in [t0, stop]."""
        groups = self.groups
        tokens = upto(rec.tokens, b, final)
        for t, produced in tokens:
            if t0 is not None and t > t0:
                self.tokens += produced
                if self.token_times is not None:
                    self.token_times.add(t, produced)
            if groups is not None:
                groups.returned(t)
        batches = upto(rec.batches, b, final)
        if self.occupancy is not None:
            self.occupancy.fold(batches, tokens, b, t0)
        for bt in batches:
            inside = t0 is not None and bt.launch_s >= t0
            if groups is not None:
                groups.launch(bt.launch_s, bt.requests, inside)
            if not inside:
                continue
            self.batches += 1
            self.batch_requests += bt.requests
            if bt.kind == "decode":
                self.decode_batches += 1
                self.decode_requests += bt.requests
                if bt.slot < self.slots:
                    self.slot_decode[bt.slot] += bt.requests
                    self.slot_decode_batches[bt.slot] += 1
        evictions = upto(rec.evictions, b, final)
        self.evictions_total += len(evictions)
        self.evictions += sum(1 for t, _ in evictions if t0 is not None and t > t0)

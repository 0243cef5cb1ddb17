"""The rows of a run in progress: busy intervals, launched batches, returned tokens.

The simulation appends rows to a `Recorder` while it runs (plain list appends of
small named tuples: the recorder sits on the simulator's hot path), each at or before
its start. tally.py folds them into running figures as the run goes, after which the
recorder lets go of the rows no later stretch needs (`Recorder.drop_before`);
record.py turns the finished run into a frozen `Record`.
"""

from __future__ import annotations

from typing import NamedTuple


class Interval(NamedTuple):
    """A stretch of time a resource was busy (or a transfer waited).

    The simulation appends interval rows as plain `(start_s, end_s)` tuples: they are
    the most frequent rows and building a NamedTuple costs ten times a tuple literal
    (README Performance). An Interval is a tuple, so both read the same way
    (unpacking, numpy arrays); hand-built records may use either."""

    start_s: float
    end_s: float


# an interval row as the lists hold it: a plain (start_s, end_s) tuple or an Interval
IntervalRow = tuple[float, float]


class Batch(NamedTuple):
    """A micro-batch as the engine launched it."""

    launch_s: float
    slot: int
    requests: int
    kind: str  # "decode", "prefill" or "mixed"


class TokenReturn(NamedTuple):
    """Sampled tokens back on the first stage."""

    time_s: float
    tokens: int


# The engine loop's parts (its thread, stage 0: `Recorder.cpu` is their union) and the
# other host processes' (docs/host-loop.md §6): the detokenizer (SGLang), the API
# process's streaming and its front end (tokenising each request), and the launching of
# the first stage's kernels by whichever thread launches them (the loop's own, or a
# forward thread or worker process beside it)
LOOP_PARTS = ("scheduler", "input_prep", "broadcast", "output_step", "launch")
PROCESS_PARTS = ("detokenizer", "api_stream", "front_end", "kernel_launch")
HOST_PARTS = LOOP_PARTS + PROCESS_PARTS


def hop_name(stage: int, stages: int) -> str:
    """The name of the PP hop out of `stage` (from the last stage: back to stage 0)."""
    return f"stage{stage}->stage{(stage + 1) % stages}"


class Recorder:
    """The rows of a run in progress, appended once each, each at or before its start
    (tally.py folds them as the run goes). Per-stage lists are indexed by stage; hops
    are per stage too (the hop out of that stage)."""

    __slots__ = (
        "compute",
        "comm",
        "hops",
        "cpu",
        "host",
        "tokens",
        "batches",
        "link_wait",
        "evictions",
        "kv_free",
    )

    def __init__(self, stages: int) -> None:
        self.compute: list[list[IntervalRow]] = [[] for _ in range(stages)]
        self.comm: list[list[IntervalRow]] = [[] for _ in range(stages)]  # TP collectives
        self.hops: list[list[IntervalRow]] = [[] for _ in range(stages)]  # hop out of each stage
        self.cpu: list[IntervalRow] = []  # the engine loop's CPU on the first stage (every part)
        # the host loop by part (HOST_PARTS): the engine loop's (also in `cpu`) and the
        # output path's and front end's processes
        self.host: dict[str, list[IntervalRow]] = {part: [] for part in HOST_PARTS}
        self.tokens: list[TokenReturn] = []
        self.batches: list[Batch] = []
        self.link_wait: list[IntervalRow] = []  # waits for a shared PCIe link
        # (time_s, rid): a running request evicted for KV (SGLang retract, vLLM preempt)
        self.evictions: list[tuple[float, int]] = []
        self.kv_free: list[tuple[float, int]] = []  # (launch_s, KV tokens free), per batch

    def clip(self, end_s: float) -> None:
        """Cut the rows at the run's stop: work booked to start after it was never
        reached; work under way at the stop ends there (a kept record, the trace)."""
        for rows in (*self.compute, *self.comm, *self.hops, self.cpu, self.link_wait, *self.host.values()):
            rows[:] = [(a, b if b <= end_s else end_s) for a, b in rows if a < end_s]

    def drop_before(self, b: float, final: bool = False) -> None:
        """Let go of the rows a fold up to `b` has counted and no later stretch needs:
        intervals that end by `b` and points before it (every row, when `final`)."""
        for rows in (*self.compute, *self.comm, *self.hops, self.cpu, self.link_wait, *self.host.values()):
            rows[:] = [r for r in rows if r[1] > b] if not final else []
        for points in (self.tokens, self.batches, self.evictions, self.kv_free):
            del points[: len(upto(points, b, final))]


def upto(points: list, b: float, final: bool) -> list:
    """The leading points (time first, appended in time order) before `b`; all if final."""
    if final:
        return points
    k = len(points)
    while k and points[k - 1][0] >= b:
        k -= 1
    return points[:k]

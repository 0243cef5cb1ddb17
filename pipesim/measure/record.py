"""What one run recorded, as a value: its figures and, when kept, its rows.

The simulation appends rows to a `Recorder` (rows.py) while it runs; `fold` folds them
into running figures as the run goes (tally.py) and lets go of them, and `freeze`
turns the finished run into a frozen `Record` that metrics.py and trace.py read.
Nothing downstream reads the Simulation itself, so a metric can be checked on a Record
built by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .request_tally import RequestTally
from .rows import Batch, IntervalRow, Recorder, TokenReturn, hop_name
from .tally import StepTally


def fold(
    rows: Recorder,
    steps: StepTally,
    now_s: float,
    window_start_s: float | None,
    final: bool = False,
    drop: bool = True,
) -> None:
    """Fold `rows` up to `now_s` into `steps` (StepTally.fold), then let go of the rows
    no later stretch needs (`drop`); a run that keeps every row (the trace) folds once,
    with `final`, and drops none."""
    if not (final or drop):
        raise ValueError("a fold that keeps its rows must be the run's last")
    steps.fold(rows, now_s, window_start_s, final)
    if drop:
        rows.drop_before(now_s, final)


def freeze(
    rows: Recorder,
    *,
    stage_gpus: tuple[tuple[int, ...], ...],
    layers_per_stage: tuple[int, ...],
    slots: int,
    groups: int = 0,
    clients: int | None,
    window_start_s: float | None,
    end_s: float,
    events: int,
    engine_load: float | None = None,
    dp: int = 1,
    steps: StepTally | None = None,
    requests: RequestTally | None = None,
    keep_rows: bool = True,
    period: tuple[int, int] | None = None,
    verdict: tuple[float, float, tuple[int, int]] | None = None,
) -> Record:
    """The finished run as a value. The rows not yet folded into `steps` (all of
    them, for a record built by hand) are folded now, over the window
    [window_start_s, end_s] (None: the run never reached its window). With
    `keep_rows` the rows stay, cut at the stop (`clip`), and are handed over, not
    copied. With data parallelism (dp > 1, pp = 1) the rows are the DP ranks and
    there are no hops."""
    pp = len(stage_gpus)
    if steps is None:
        steps = StepTally(len(rows.compute), slots, groups if dp == 1 else 0, open_loop=clients is None)
    fold(rows, steps, end_s, window_start_s, final=True, drop=not keep_rows)
    if keep_rows:
        rows.clip(end_s)
    names = tuple(hop_name(s, pp) for s in range(pp)) if pp > 1 and dp == 1 else ()
    assert steps.window_s is not None  # set by the final fold
    return Record(
        compute=tuple(rows.compute),
        comm=tuple(rows.comm),
        hops={n: rows.hops[s] for s, n in enumerate(names)},
        hop_names=names,
        cpu=rows.cpu,
        host=rows.host,
        tokens=rows.tokens,
        batches=rows.batches,
        link_wait=rows.link_wait,
        evictions=rows.evictions,
        kv_free=rows.kv_free,
        stage_gpus=stage_gpus,
        layers_per_stage=layers_per_stage,
        slots=slots,
        groups=groups,
        clients=clients,
        window_s=steps.window_s,
        end_s=end_s,
        events=events,
        engine_load=engine_load,
        dp=dp,
        steps=steps,
        requests=requests if requests is not None else RequestTally(closed=clients is not None),
        kept=keep_rows,
        period=period,
        verdict=verdict,
    )


@dataclass(frozen=True)
class Record:
    """What one finished run recorded, and the run's shape needed to read it: its
    figures (`steps`, `requests`) and, for a kept record (`kept`: the trace), every
    row; a summary record's row lists are empty."""

    compute: tuple[list[IntervalRow], ...]  # per stage
    comm: tuple[list[IntervalRow], ...]  # per stage: TP collectives
    hops: dict[str, list[IntervalRow]]  # hop name -> its transfers (empty without PP)
    hop_names: tuple[str, ...]  # per stage: the hop out of it (empty without PP)
    cpu: list[IntervalRow]
    tokens: list[TokenReturn]
    batches: list[Batch]
    link_wait: list[IntervalRow]
    stage_gpus: tuple[tuple[int, ...], ...]  # per stage: its TP group
    layers_per_stage: tuple[int, ...]
    slots: int  # micro-batch slots of the engine (1: none)
    clients: int | None  # closed-loop concurrency (None: open loop or trace)
    window_s: tuple[float, float]  # the measurement window
    end_s: float  # simulated time at the end of the run
    events: int  # events the simulation scheduled
    steps: StepTally  # the rows' figures over the window (tally.py)
    requests: RequestTally  # the finished requests' rows and figures (request_tally.py)
    # closed loop with more clients than the engine admits: the mean number of admitted
    # requests over the window (None: every client's request is admitted at once)
    engine_load: float | None = None
    dp: int = 1  # data-parallel ranks: with dp > 1 the per-stage rows are the ranks (pp = 1)
    # running requests evicted for KV, (time_s, rid) (SGLang retract_decode, vLLM preemption)
    evictions: list = field(default_factory=list)
    kv_free: list = field(default_factory=list)  # (launch_s, KV-cache tokens free) per batch
    host: dict = field(default_factory=dict)  # host part -> its rows (rows.HOST_PARTS; a kept record's)
    # vLLM: batches in flight (max_concurrent_batches); the i-th launched batch is in
    # group i mod groups (0: the engine has micro-batch slots instead)
    groups: int = 0
    kept: bool = True  # every row kept (the trace); False: folded as the run went
    # (P, shift): the window is whole periods of P requests of a run that repeats, its
    # slot labels moved on by `shift` each period (steady.period; None: no period seen)
    period: tuple[int, int] | None = None
    # a closed loop's throughput as its stopping rule measured it: (mean tok/s, 95%
    # half-width, (P, shift)) (sim/stopping.py Verdict; None: an open loop, or built by hand)
    verdict: tuple[float, float, tuple[int, int]] | None = None

    @property
    def pp(self) -> int:
        """Rows of the per-stage lists: the pipeline stages, or the DP ranks."""
        return len(self.stage_gpus)

    @property
    def tp(self) -> int:
        return len(self.stage_gpus[0])

    def inbound_hop(self, stage: int) -> str | None:
        """The hop whose arrival feeds `stage`: from the stage before, or for stage 0
        the sampled tokens coming back from the last stage (None without PP)."""
        return self.hop_names[(stage - 1) % self.pp] if self.hop_names else None

"""vLLM V0 (v0.5-v0.7, and under PP v0.8): its defaults and its engine loop.

Source: vllm-project/vllm at v0.5.3.post1, v0.6.0, v0.6.3.post1, v0.6.6.post1
(docs/host-loop.md §1): vllm/engine/llm_engine.py (`LLMEngine.step`, one `Scheduler` per
virtual engine), vllm/engine/async_llm_engine.py (`run_engine_loop`), vllm/core/
scheduler.py (`_schedule_default`, `_schedule_chunked_prefill`), vllm/config.py
(`SchedulerConfig`, `ModelConfig.verify_async_output_proc`), vllm/engine/arg_utils.py.

- One step on the engine loop's thread: schedule, input preparation and the TP
  broadcast (driver worker, §1.7), the launch, the model; then the step's output
  processing (detokenisation, stop checks: `out_step`), or, with the async output
  processor (v0.6 on, off under PP, with --enforce-eager and --disable-async-output-proc),
  that work after the next step's launch, under its GPU time (§1.4).
- Chunked prefill is off by default below 32K context (§1.6): a step that admits prompts
  runs them alone (prefill first) and the running decodes wait one step; with it on, as
  V1 (decodes first, prompt chunks in the token budget, 512 by default).
- `--num-scheduler-steps N` (v0.6 on): one schedule and input preparation per N decode
  steps (§1.3), charged as 1/N per step.
- Under PP, one scheduler per stage (virtual engine): each with its own `max_num_seqs`
  and `num_gpu_blocks // pp` KV blocks and one batch in flight; the loop steps them in
  turn (§1.5). A request joins the virtual engine whose turn admits it and stays there
  (V0 picks the one with the fewest unfinished requests when it arrives).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Protocol

import simpy

from ..base.errors import require
from .kv import VLLM_BLOCK_SIZE, take
from .releases import VLLM_V0_LONG_CONTEXT, VLLM_V0_SPLIT, HostRules, at_least

if TYPE_CHECKING:
    from ..costs.host import HostCosts
    from ..inputs.model import Model
    from ..inputs.plan import Plan
    from .batches import Request
    from .protocol import EngineSimulation

V0_MAX_NUM_SEQS = 256  # EngineArgs.max_num_seqs (v0.5.3.post1-v0.6.6.post1)
V0_CHUNK_TOKENS = 512  # SchedulerConfig: max_num_batched_tokens with chunked prefill
V0_GRAPH_MAX = 256  # _BATCH_SIZES_TO_CAPTURE: [1, 2, 4] + multiples of 8 up to 256


class V0Knobs(Protocol):
    """The vLLM knobs V0's defaults read (engines/vllm.py `VLLMConfig`, a frozen value)."""

    @property
    def max_num_seqs(self) -> int | None: ...

    @property
    def max_num_batched_tokens(self) -> int | None: ...

    @property
    def async_scheduling(self) -> bool | None: ...

    @property
    def gpu_memory_utilization(self) -> float: ...

    @property
    def enforce_eager(self) -> bool: ...

    @property
    def enable_prefix_caching(self) -> bool | None: ...

    @property
    def enable_chunked_prefill(self) -> bool | None: ...

    @property
    def num_scheduler_steps(self) -> int: ...

    @property
    def disable_async_output_proc(self) -> bool: ...


def resolve_v0(config: V0Knobs, plan: Plan, model: Model, kv_tokens: int, version: str) -> dict:
    """V0's resolved settings (`VLLMSettings` fields; module docstring): 256 sequences;
    chunked prefill above 32K context (`create_engine_config`), then a 512-token budget,
    else max(max_model_len, 2048) (`SchedulerConfig.__init__`); prefix caching off;
    graphs for decode batches up to 256; no async scheduling; the async output processor
    from v0.6.0 unless PP, eager or disabled."""
    split = at_least(version, VLLM_V0_SPLIT)
    require(
        not config.async_scheduling,
        f"--async-scheduling: vLLM {version} runs V0, which has no async scheduling",
    )
    require(
        split or (config.num_scheduler_steps == 1 and not config.disable_async_output_proc),
        f"--num-scheduler-steps and --disable-async-output-proc: vLLM {version} has neither (from 0.6.0 on)",
    )
    chunked = (
        model.max_context > VLLM_V0_LONG_CONTEXT
        if config.enable_chunked_prefill is None
        else config.enable_chunked_prefill
    )
    seqs = config.max_num_seqs or V0_MAX_NUM_SEQS
    tokens = config.max_num_batched_tokens or (V0_CHUNK_TOKENS if chunked else max(model.max_context, 2048))
    top = 0 if config.enforce_eager else min(V0_GRAPH_MAX, -(-seqs // 8) * 8)
    sizes = tuple(b for b in (1, 2, 4, *range(8, V0_GRAPH_MAX + 1, 8)) if b <= top)
    async_output = (
        split and plan.pp == 1 and not config.enforce_eager and not config.disable_async_output_proc
    )
    steps = config.num_scheduler_steps
    return dict(
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        async_scheduling=False,
        max_concurrent_batches=plan.pp,
        kv_tokens=kv_tokens // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE,
        gpu_memory_utilization=config.gpu_memory_utilization,
        cudagraph_max_tokens=max(sizes, default=0),
        cudagraph_capture_sizes=sizes,
        enable_prefix_caching=False if config.enable_prefix_caching is None else config.enable_prefix_caching,
        chunked_prefill=chunked,
        host=HostRules(version, "V0", False, True, async_output=async_output, scheduler_steps=steps),
        virtual_engines=plan.pp,
    )


class V0Settings(Protocol):
    """What V0's loop reads of the resolved settings (vllm_loop.py `VLLMSettings`)."""

    @property
    def host(self) -> HostRules: ...

    @property
    def virtual_engines(self) -> int: ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int: ...

    @property
    def chunked_prefill(self) -> bool: ...

    @property
    def kv_tokens(self) -> int: ...


class V0Loop(Protocol):
    """What V0's loop reads and keeps of the vLLM scheduler (vllm_loop.py)."""

    @property
    def sim(self) -> EngineSimulation: ...

    @property
    def s(self) -> V0Settings: ...

    @property
    def host(self) -> HostCosts: ...

    active: list
    computed: dict
    step: int
    ve_used: list


def run_v0(sched: V0Loop) -> Generator[simpy.Event, object, None]:
    """Each virtual engine in turn: take its batch's return (its output processing then,
    or after the next launch with the async output processor), form its next batch,
    schedule and prepare it, launch it and launch its kernels (the driver worker is in
    the engine's process)."""
    sim, host, rules, ves = sched.sim, sched.host, sched.s.host, sched.s.virtual_engines
    inflight: list = [None] * ves
    pending = 0.0  # output processing owed to the next launch (async output processor)
    while True:
        worked = False
        for ve in range(ves):
            mb = inflight[ve]
            if mb is not None:
                yield mb.returned
                inflight[ve], worked = None, True
                out = host.step(mb.size, 0).out_step_s
                if rules.async_output:
                    pending += out
                else:
                    yield from sim.charge((("output_step", out),))
            batch = form_ve(sched, ve)
            if batch is None:
                continue
            decode, prefill = batch
            steps = 1 if prefill else rules.scheduler_steps
            yield from sim.charge(
                host.before_launch(len(decode) + len(prefill), sum(c for _, c, _ in prefill), steps)
            )
            mb = inflight[ve] = sim.launch(0, decode, prefill)
            worked = True
            launch = host.launch_s(0, mb.shape.graphed, bool(prefill))
            yield from sim.charge((("launch", launch), ("output_step", pending)))
            pending = 0.0
        if not worked:
            yield sim.wait_arrival()


def form_ve(sched: V0Loop, ve: int) -> tuple[list, list] | None:
    """Virtual engine `ve`'s next batch: without chunked prefill, the prompts it can admit
    alone (`_schedule_default`: "Don't schedule decodes if prefills are scheduled"), else
    its running requests' decodes; with chunked prefill, decodes and prompt chunks in the
    token budget (`_schedule_chunked_prefill`). A request that cannot get its blocks
    preempts the virtual engine's last running request (recompute)."""
    s = sched.s
    mine = [r for r in sched.active if r.slot == ve]
    budget = s.max_num_batched_tokens
    decode: list = []
    prefill: list = []
    if not s.chunked_prefill:
        prefill = _admit(sched, ve, budget, len(mine))
        if prefill:
            sched.step += 1
            return [], prefill
    preempted = False
    for r in mine:
        if budget <= 0 or r.queued is not None:
            continue
        if r.scheduled < r.prefill_len:
            n = min(r.prefill_len - r.scheduled, budget)
        elif r.inflight or r.prefilled < r.prefill_len or r.generated >= r.output_len:
            continue
        else:
            n = 1
        while not _allocate(sched, r, n, ve):
            preempted = True
            victim = [x for x in sched.active if x.slot == ve][-1]
            _preempt(sched, victim)
            if victim is r:
                break
        if r.queued is not None:  # _preempt may have evicted r (mypy keeps the narrowing above)
            continue  # type: ignore[unreachable]
        if n == 1 and r.scheduled >= r.prefill_len:
            decode.append(r)
        else:
            prefill.append((r, n, r.scheduled))
            r.scheduled += n
        budget -= n
    if s.chunked_prefill and not preempted:
        prefill += _admit(sched, ve, budget, len(mine))
    if not decode and not prefill:
        return None
    sched.step += 1
    return decode, prefill


def _admit(sched: V0Loop, ve: int, budget: int, running: int) -> list:
    """Waiting requests into `ve` while its sequences, the token budget (whole prompts
    without chunked prefill) and its KV blocks allow."""
    sim, s = sched.sim, sched.s
    out = []
    waiting: deque[Request] = sim.waiting
    while waiting and budget > 0 and running < s.max_num_seqs:
        r = waiting[0]
        if r.inflight:
            break  # preempted with a batch still in flight: it resumes once that is back
        full = r.input_len + r.generated
        n = min(full, budget)
        if (n < full and not s.chunked_prefill) or not _allocate(sched, r, n, ve, fresh=True):
            break
        waiting.popleft()
        sim.admit(r)
        r.slot = ve
        sched.active.append(r)
        out.append((r, n, 0))
        r.prefilled, r.scheduled = 0, n
        budget -= n
        running += 1
    return out


def _allocate(sched: V0Loop, r: Request, n: int, ve: int, fresh: bool = False) -> bool:
    """The blocks `r` needs for `n` more computed tokens, within the virtual engine's own
    (`num_gpu_blocks // pp`, its BlockSpaceManager), or False."""
    sim = sched.sim
    share = sched.s.kv_tokens // VLLM_BLOCK_SIZE // sched.s.virtual_engines * VLLM_BLOCK_SIZE
    computed = n + (0 if fresh else sched.computed.get(r.rid, 0))
    need = -(-computed // VLLM_BLOCK_SIZE) * VLLM_BLOCK_SIZE - (0 if fresh else r.kv_reserved)
    if need > sim.kv_free or sched.ve_used[ve] + need > share:
        return False
    take(sim, r, need)
    sched.ve_used[ve] += need
    sched.computed[r.rid] = computed
    return True


def _preempt(sched: V0Loop, r: Request) -> None:
    """Preempt `r` (recompute: V0's default for a single sequence), its blocks back."""
    sched.ve_used[r.slot] -= r.kv_reserved
    sched.active.remove(r)
    sched.computed.pop(r.rid, None)
    sched.sim.requeue(r, front=True)


def returned_v0(sched: V0Loop, finished: list[Request]) -> None:
    """Finished requests give their virtual engine's blocks back."""
    for r in finished:
        sched.ve_used[r.slot] -= r.kv_reserved

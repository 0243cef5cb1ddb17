"""SGLang: its knobs, their defaults, and how they resolve (the loop that runs them:
sglang_loop.py).

Source: sgl-project/sglang, python/sglang/srt/managers/scheduler_pp_mixin.py
(`event_loop_pp`), scheduler.py, server_args.py, model_executor/model_runner.py.

- The PP loop runs `pp_loop_size = pp_size + pp_async_batch_depth` micro-batch slots;
  every stage visits them in the same fixed order; each slot owns a running batch.
- At a slot's turn the first stage first takes that slot's previous results (it
  blocks on the outputs relayed from the last stage), then forms the slot's next
  batch: prefill-first (`get_next_batch_to_run`): when requests wait, a (chunked)
  prefill batch instead of the slot's decode batch; prefill and decode never mix.
- A request joins the slot that prefilled it and stays there until it finishes.
- Per-slot cap `pp_max_micro_batch_size`, default `max(max_running_requests //
  pp_size, 1)` (`Scheduler.__init__`), checked by `get_num_allocatable_reqs`;
  the total is bounded by `max_running_requests` and free KV-cache tokens.
- A chunked prefill is scheduler-wide (`self.chunked_req`): its next chunk goes into
  whichever slot comes next, and is admitted even when that slot is at its cap.
- With pp_size 1 the normal loop runs: one batch at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from ..base.checks import MAX_ASYNC_DEPTH, MAX_BATCH_TOKENS, MAX_CONFIG_SIZE, MAX_RUNNING
from ..profiles.hostloop import newest as newest_version
from .knobs import check_values, knob
from .releases import sglang_rules
from .reserve import sglang_rule
from .sglang_loop import SGLangSettings

if TYPE_CHECKING:
    from ..inputs.box import Box
    from ..inputs.memory import MemoryRule
    from ..inputs.model import Model
    from ..inputs.plan import Plan

MiB = 2**20


@dataclass(frozen=True)
class SGLangConfig:
    """SGLang launch flags pipesim models, each declared once (engines/knobs.py; flags
    and defaults as python/sglang/srt/server_args.py `ServerArgs` has them). None means
    SGLang derives the value, as `resolve` does."""

    max_running_requests: int | None = knob(
        None,
        help="total running requests (with DP attention: split over the ranks)",
        default_text="min(KV tokens // 2, request pool of 2048-4096)",
        bounds=(1, MAX_RUNNING),
        source="server_args.py `max_running_requests`; model_runner.py (request pool)",
    )
    pp_max_micro_batch_size: int | None = knob(
        None,
        help="per-slot cap of running requests",
        default_text="max(max-running-requests // pp, 1)",
        bounds=(1, MAX_RUNNING),
        source="server_args.py `pp_max_micro_batch_size`; scheduler.py `Scheduler.__init__`",
    )
    pp_async_batch_depth: int = knob(
        0,
        help="extra micro-batch slots: the last PP rank holds a batch's outputs this many iterations",
        bounds=(0, MAX_ASYNC_DEPTH),
        source="server_args.py `pp_async_batch_depth`; scheduler_pp_mixin.py `event_loop_pp`",
    )
    chunked_prefill_size: int | None = knob(
        None,
        help="prefill chunk tokens (with DP attention: divided by dp)",
        default_text="by GPU memory: 2048, 4096, 8192 or 16384",
        bounds=(1, MAX_BATCH_TOKENS),
        source="server_args.py `chunked_prefill_size` (its default by GPU memory)",
    )
    max_prefill_tokens: int = knob(
        16384,
        help="token budget of one prefill batch",
        bounds=(1, MAX_BATCH_TOKENS),
        source="server_args.py `max_prefill_tokens`; schedule_policy.py `PrefillAdder`",
    )
    mem_fraction_static: float | None = knob(
        None,
        help="share of GPU memory for weights + KV cache, in (0, 1)",
        default_text="by GPU memory, tp and pp",
        bounds=(0, 1),
        source="server_args.py `_handle_gpu_memory_settings`",
    )
    max_total_tokens: int | None = knob(
        None,
        help="cap on the KV pool's tokens (the profiled pool when larger)",
        default_text="the profiled pool",
        bounds=(1, MAX_CONFIG_SIZE),
        source="server_args.py `max_total_tokens`; model_runner.py `init_memory_pool`",
    )
    disable_cuda_graph: bool = knob(
        False,
        help="launch every kernel eagerly: no CUDA graphs",
        source="server_args.py `disable_cuda_graph` (store_true)",
    )
    cuda_graph_max_bs: int | None = knob(
        None,
        help="largest decode batch replayed as a CUDA graph",
        default_text="by GPU memory and tp",
        bounds=(1, MAX_RUNNING),
        source="server_args.py `cuda_graph_max_bs`, `_generate_cuda_graph_batch_sizes`",
    )
    disable_overlap_schedule: bool = knob(
        False,
        help="no overlap scheduler: the next batch is scheduled after this one's results (on from 0.3.6 otherwise)",
        source="server_args.py `disable_overlap_schedule` (store_true); scheduler.py `event_loop_overlap`",
    )

    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    partition_rule: ClassVar[str] = "sglang"
    # the knobs a planner sweeps: the running cap and the prefill chunk (explore/screen.py)
    running_cap_knob: ClassVar[str] = "max_running_requests"
    prefill_chunk_knob: ClassVar[str] = "chunked_prefill_size"
    # knobs the engine derives from another when not given (Scheduler.__init__:
    # pp_max_micro_batch_size = max(max_running_requests // pp_size, 1)): a profile's
    # deployment value for them does not apply once the user gives the source knob
    derived_from: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {"max_running_requests": ("pp_max_micro_batch_size",)}
    )

    def validate(self) -> None:
        """Every knob within its declaration (`knobs.check_values`)."""
        check_values(SGLangConfig, asdict(self))

    def graph_max_bs(self, gpu_memory_bytes: float, tp: int) -> int:
        """`cuda_graph_max_bs` default by GPU memory and tp (server_args.py): decode
        batches up to this size replay a CUDA graph."""
        if self.cuda_graph_max_bs is not None:
            return self.cuda_graph_max_bs
        gb = gpu_memory_bytes / MiB / 1024
        if gb < 20:
            return 8
        if gb < 35:
            return 24 if tp < 4 else 80
        if gb < 60:
            return 32 if tp < 4 else 160
        return (256 if tp < 4 else 512) if gb < 160 else 512

    def memory_fraction(self, gpu_memory_bytes: float, tp: int, pp: int) -> float:
        """`mem_fraction_static` default (server_args.py, _handle_gpu_memory_settings):
        reserve 512 MB + 1.5 x chunk + 2 x cuda-graph batch + tp*pp/8 GB, at least
        10 GB on GPUs above 60 GB."""
        if self.mem_fraction_static is not None:
            return self.mem_fraction_static
        mem_mb = gpu_memory_bytes / MiB
        graph_bs = self.graph_max_bs(gpu_memory_bytes, tp)
        reserved = (
            512 + max(self.chunk_size(gpu_memory_bytes), 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
        )
        if mem_mb > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        return round((mem_mb - reserved) / mem_mb, 3)

    def memory_rule(self, box: Box, plan: Plan, model: Model, version: str) -> MemoryRule:
        """How SGLang sizes its KV pool (engines/reserve.py; the same rule in every 0.5.x)."""
        fraction = self.memory_fraction(box.gpu.memory_bytes, plan.tp, plan.pp)
        return sglang_rule(fraction, box, plan, self.max_total_tokens)

    def chunk_size(self, gpu_memory_bytes: float) -> int:
        """`chunked_prefill_size` default by GPU memory (server_args.py)."""
        if self.chunked_prefill_size is not None:
            return self.chunked_prefill_size
        gb = gpu_memory_bytes / MiB / 1024
        return 2048 if gb < 35 else 4096 if gb < 60 else 8192 if gb < 160 else 16384

    def resolve(
        self, gpu_memory_bytes: float, plan: Plan, model: Model, kv_tokens: int, version: str | None = None
    ) -> SGLangSettings:
        # model_runner.py: req pool = clamp(kv_tokens / context_len * 512, 2048, 4096);
        # max_running_requests = min(kv_tokens // 2, req pool) unless given.
        pool = min(max(int(kv_tokens / model.max_context * 512), 2048), 4096)
        # with DP attention every rank is a scheduler of its own (kv_tokens is one rank's
        # pool); the given --max-running-requests is split over the ranks and the chunk
        # divided by dp (docs/engines.md §8)
        dp = plan.dp if plan.dp_attention else 1
        given = self.max_running_requests and max(self.max_running_requests // dp, 1)
        mrr = given or min(kv_tokens // 2, pool)
        mrr = max(1, min(mrr, pool))
        cap = self.pp_max_micro_batch_size or max(mrr // plan.pp, 1)
        slots = plan.pp + self.pp_async_batch_depth if plan.pp > 1 else 1
        return SGLangSettings(
            max_running_requests=mrr,
            pp_max_micro_batch_size=cap,
            pp_async_batch_depth=self.pp_async_batch_depth,
            slots=slots,
            chunked_prefill_size=max(self.chunk_size(gpu_memory_bytes) // dp, 1),
            max_prefill_tokens=self.max_prefill_tokens,
            kv_tokens=kv_tokens,
            mem_fraction_static=self.memory_fraction(gpu_memory_bytes, plan.tp, plan.pp),
            cuda_graph_max_bs=0 if self.disable_cuda_graph else self.graph_max_bs(gpu_memory_bytes, plan.tp),
            host=sglang_rules(
                version or newest_version("sglang"),
                plan.pp,
                plan.tp,
                plan.dp_attention,
                self.disable_overlap_schedule,
            ),
        )

"""The engine's host loop in seconds: what the CPU does around each step, term by term.

The pure arithmetic of docs/host-loop.md §6, shared by the simulator (which charges each
term where the engine does it and hides what the engine hides: engines/, sim/) and by
any steady-state model (`compose` is §6.2's table as one function). Per step of a stage
with `B` requests, `P` prompt tokens, `L` layers and `tp` ranks, every term a profile
parameter (profiles/profile.py; defaults per engine and version in
pipesim/data/host_loop.toml) times `host_cpu_factor`, the deployment's CPU against the
one the engines' code was timed on:

    sched(B, P)   = sched_base + sched_per_req x B + sched_per_prefill_token x P
    prep(B)       = prep_base + prep_per_req x B
    out_step(B)   = out_step_base + out_step_per_req x B          (vLLM V0's engine loop)
    bcast(tp)     = tp_bcast_base + tp_bcast_per_rank x (tp - 1)  (tp > 1; 0 at tp = 1)
    launch(L)     = kernels of the stage's layers and step x launch_us_per_kernel
                    (eager; a graphed batch launches only the engine's piecewise kernels)
    out path      = detokenize_step + detokenize_token x tokens   (detokenizer process)
                  + stream_step + stream_token x tokens           (API process), serial each
    front end     = frontend_ms per request                        (API process)

A deployment's own `eager_launch_us_per_layer` (measured or fitted, > 0) replaces the
kernel count x per-kernel cost of an eager layer, as it is; `cpu_iteration_ms` is its own
extra per loop iteration, as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..profiles.hostloop import kernels

if TYPE_CHECKING:
    from ..inputs.model import Model
    from ..inputs.plan import Plan
    from ..profiles.profile import Params

US = 1e-6


@dataclass(frozen=True)
class StepHost:
    """The host-loop seconds of one step, by term (launch apart: `launch_s`)."""

    sched_s: float  # schedule, KV allocation, applying the sampled tokens
    prep_s: float  # input preparation and sampling's host part
    bcast_s: float  # the step's objects to the other TP ranks over the CPU group
    out_step_s: float  # vLLM V0: the engine loop's output processing

    @property
    def cpu_step_s(self) -> float:
        """What precedes the launch on the engine loop: sched + prep + bcast."""
        return self.sched_s + self.prep_s + self.bcast_s


def step_host(params: Params, requests: int, prefill_tokens: int, tp: int) -> StepHost:
    """The host terms of a step of `requests` requests holding `prefill_tokens` prompt
    tokens on a stage of `tp` ranks (module docstring)."""
    p, f = params, params.host_cpu_factor * US
    return StepHost(
        sched_s=(
            p.sched_base_us + p.sched_per_req_us * requests + p.sched_per_prefill_token_us * prefill_tokens
        )
        * f,
        prep_s=(p.prep_base_us + p.prep_per_req_us * requests) * f,
        bcast_s=bcast_s(params, tp),
        out_step_s=(p.out_step_base_us + p.out_step_per_req_us * requests) * f if requests else 0.0,
    )


def bcast_s(params: Params, tp: int) -> float:
    """The CPU-group broadcast to the other TP ranks, per step or loop iteration."""
    if tp <= 1:
        return 0.0
    return (params.tp_bcast_base_us + params.tp_bcast_per_rank_us * (tp - 1)) * params.host_cpu_factor * US


def empty_iteration_s(params: Params, tp: int) -> float:
    """A loop iteration with no batch to run (SGLang's PP slots, docs/host-loop.md §3.4):
    the scheduler's fixed part, the broadcast and the deployment's own extra."""
    return (
        params.sched_base_us * params.host_cpu_factor * US
        + bcast_s(params, tp)
        + params.cpu_iteration_ms * 1e-3
    )


def layer_kernels(model: Model, layer: int, tp: int) -> float:
    """Kernels one decoder layer launches without a CUDA graph (docs/host-loop.md §4.2):
    its attention (GQA or MLA), its MLP (dense, or routed experts and a shared expert)
    and, at TP > 1, its two all-reduces."""
    k = kernels()
    n = k["attention_mla"] if model.mla else k["attention_gqa"]
    if model.is_moe_layer(layer):
        assert model.moe is not None  # is_moe_layer: a MoE model
        n += k["moe_routed"] + (k["moe_shared"] if model.moe.n_shared_experts else 0.0)
    else:
        n += k["mlp_dense"]
    return n + (k["tp_comm"] if tp > 1 else 0.0)


def launch_s(
    params: Params, model: Model, layers: list[int] | range, tp: int, last: bool, graphed: bool, prefill: bool
) -> float:
    """CPU seconds to launch a step's kernels on one stage: every kernel of its layers
    (and the step's own on the last stage) when eager; a graphed batch only the engine's
    piecewise kernels per layer (vLLM V1's attention between graph pieces)."""
    per_kernel = params.launch_us_per_kernel * params.host_cpu_factor * US
    if graphed:
        piecewise = params.piecewise_kernels_mixed if prefill else params.piecewise_kernels_decode
        return len(layers) * piecewise * per_kernel
    if params.eager_launch_us_per_layer:
        return len(layers) * params.eager_launch_us_per_layer * US
    n = sum(layer_kernels(model, i, tp) for i in layers) + (kernels()["per_step"] if last else 0.0)
    return n * per_kernel


def output_path_s(params: Params, tokens: int) -> tuple[float, float]:
    """(detokenizer process, API process) seconds for one returned step's `tokens`."""
    f = params.host_cpu_factor * US
    detok = (params.detokenize_step_us + params.detokenize_token_us * tokens) * f
    stream = (params.stream_step_us + params.stream_token_us * tokens) * f
    return (detok if params.detokenize_step_us or params.detokenize_token_us else 0.0), (
        stream if params.stream_step_us or params.stream_token_us else 0.0
    )


def frontend_s(params: Params) -> float:
    """The API process per request: HTTP, tokenise, hand over (docs/engines.md §1)."""
    return params.frontend_ms * params.host_cpu_factor * 1e-3


def hop_cpu_s(params: Params) -> float:
    """SGLang PP: the pickled metadata relay per hop and micro-batch (docs/host-loop.md §3.4)."""
    return params.cpu_hop_ms * params.host_cpu_factor * 1e-3


def out_token_cap_tok_s(params: Params) -> float:
    """The output path's ceiling on output tokens per second: its slower serial process
    at one token (inf without one)."""
    f = params.host_cpu_factor * US
    slowest = max(params.detokenize_token_us, params.stream_token_us) * f
    return 1.0 / slowest if slowest else float("inf")


@dataclass(frozen=True)
class StepTime:
    """A steady decode step of one stage, composed (§6.2)."""

    step_s: float  # start to start of two steps
    host_s: float  # CPU seconds on the engine loop per step
    exposed_s: float  # of the step, the GPU idle for the host: step - gpu


def compose(
    gpu_s: float,
    host: StepHost,
    launch: float,
    *,
    overlap: bool,
    launch_on_loop: bool,
    async_output: bool = False,
    scheduler_steps: int = 1,
) -> StepTime:
    """The step time of docs/host-loop.md §6.2 for a stage whose GPU needs `gpu_s`:

    - overlap off: `cpu_step / steps + max(gpu, launch [+ out_step with the async output
      processor, on the same thread]) [+ out_step without it]`;
    - overlap on (SGLang's overlap scheduler, vLLM V1's async scheduling):
      `max(gpu, launch, cpu_step [+ launch when the loop's thread launches])`.

    `cpu_step` is sched + prep + bcast; `scheduler_steps` is vLLM V0's multi-step N (the
    schedule paid once per N steps)."""
    cpu = host.cpu_step_s / scheduler_steps
    if overlap:
        loop = cpu + (launch if launch_on_loop else 0.0)
        step = max(gpu_s, launch, loop)
        return StepTime(step, loop, step - gpu_s)
    if async_output:
        gpu_side = max(gpu_s, launch + host.out_step_s if launch_on_loop else max(launch, host.out_step_s))
        step = cpu + gpu_side
    else:
        step = cpu + max(gpu_s, launch) + host.out_step_s
    loop = cpu + host.out_step_s + (launch if launch_on_loop else 0.0)
    return StepTime(step, loop, step - gpu_s)


class HostCosts:
    """The host terms of one run (params, model, plan bound): what the engines' schedulers
    and the front end charge (sim/), and the stages' launch (stage.py)."""

    def __init__(self, params: Params, model: Model, plan: Plan) -> None:
        self.params, self.model, self.plan = params, model, plan
        self.tp = plan.tp
        self.empty_s = empty_iteration_s(params, plan.tp)
        self.extra_s = params.cpu_iteration_ms * 1e-3
        self.frontend_s = frontend_s(params)
        self._launch: dict = {}

    def step(self, requests: int, prefill_tokens: int) -> StepHost:
        return step_host(self.params, requests, prefill_tokens, self.tp)

    def before_launch(
        self, requests: int, prefill_tokens: int, steps: int = 1
    ) -> tuple[tuple[str, float], ...]:
        """The engine loop's CPU before a batch's launch, by part: sched + prep + broadcast
        of its requests and prompt tokens, and the deployment's own extra per iteration;
        paid once per `steps` decode steps (vLLM V0 multi-step)."""
        h = self.step(requests, prefill_tokens)
        return (
            ("scheduler", h.sched_s / steps + self.extra_s),
            ("input_prep", h.prep_s / steps),
            ("broadcast", h.bcast_s / steps),
        )

    def empty(self, iterations: int) -> tuple[tuple[str, float], ...]:
        """`iterations` loop iterations with no batch (SGLang's empty PP slots), by part."""
        bcast = bcast_s(self.params, self.tp)
        return (("scheduler", (self.empty_s - bcast) * iterations), ("broadcast", bcast * iterations))

    def launch_s(self, stage: int, graphed: bool, prefill: bool) -> float:
        """Launch seconds of a batch on `stage`, graphed or not, with prompt tokens or
        not (module docstring)."""
        key = (stage, graphed, prefill)
        hit = self._launch.get(key)
        if hit is None:
            plan = self.plan
            hit = self._launch[key] = launch_s(
                self.params,
                self.model,
                plan.stage_layers(stage),
                self.tp,
                stage == plan.pp - 1,
                graphed,
                prefill,
            )
        return hit

    def output(self, tokens: int) -> tuple[float, float]:
        return output_path_s(self.params, tokens)

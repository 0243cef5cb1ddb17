"""The engine's host loop as the steady-state model charges it: every CPU term the
simulator charges a batch, a loop iteration, a request or a returned step, taken from
costs/host.py (the simulator's own arithmetic: `HostCosts` and `compose`) and hidden as
the release's rules hide it (engines/releases.py `HostRules`), in one place.

Where the simulator charges each term (docs/engines.md §10, docs/host-loop.md §6.2):

- before each launch, on the engine loop: sched + prep + broadcast of the batch's
  requests and prompt tokens, and the profile's own extra (`HostCosts.before_launch`,
  what every scheduler charges; vLLM V0's multi-step share of it on decode steps);
- after the launch, where the loop's thread launches the kernels (SGLang without the
  overlap scheduler, vLLM V0, vLLM V1 at TP = PP = 1): the launch (`HostCosts.launch_s`);
- vLLM V0's output processing per returned batch: before the next launch, or under
  the next step's GPU with the async output processor;
- SGLang PP: every slot iteration on every rank, an empty one `HostCosts.empty_s`; each
  later rank runs the first rank's iteration again and launches its own stage, after
  the previous rank's launch and the metadata relay (`hop_cpu_s`; sim/pipeline.py);
- the front end per request and the output path per returned step, each a serial
  process (the detokenizer; the API process, which tokenises too; sim/frontend.py).

How a step hides them is `compose` (docs/host-loop.md §6.2): the overlap scheduler and
async scheduling run the loop beside the GPU, the others before it. The slot schedule
(slot_schedule.py) reads the host only through the `HostLoop` this module builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..costs.host import StepHost, StepTime, compose, hop_cpu_s

if TYPE_CHECKING:
    from ..costs.host import HostCosts
    from ..engines.protocol import EngineSettings
    from ..engines.releases import HostRules


@dataclass(frozen=True)
class BatchHost:
    """The host's seconds around one batch: its step as `compose` hides the loop (the
    GPU given as the batch's trip), and what each rank's loop spends on it."""

    step: StepTime  # from one launch of its slot to the next, with `gpu_s` the batch's trip
    before_s: float  # the engine loop's CPU before its launch (the later ranks' too, SGLang PP)
    rank_loop_s: tuple[float, ...]  # each rank's loop busy for it (one entry unless the ranks run the loop)


class HostLoop:
    """The host-loop terms of one engine run: its profile's costs bound to its model and
    plan (`HostCosts`) and its release's rules (`HostRules`)."""

    def __init__(self, host: HostCosts, rules: HostRules, ranks_run_loop: bool) -> None:
        self.host, self.rules = host, rules
        self.ranks_run_loop = ranks_run_loop  # SGLang PP: every rank runs every slot iteration
        self.pp = host.plan.pp
        self.frontend_s = host.frontend_s  # the API process per request (tokenise, hand over)
        self.empty_s = host.empty_s  # an empty slot iteration (SGLang PP)
        self.relay_s = hop_cpu_s(host.params)  # a rank's metadata from the previous rank (SGLang PP)

    @property
    def overlap(self) -> bool:
        """The loop's CPU runs beside the GPU: SGLang's overlap scheduler, vLLM V1's
        async scheduling (two batches in flight, every request in both)."""
        return self.rules.overlap

    def before_s(self, requests: int, prefill_tokens: int) -> float:
        """The engine loop's CPU before a batch's launch, as the engines charge it
        (`HostCosts.before_launch`: sched + prep + broadcast and the profile's extra;
        vLLM V0 multi-step: once per N decode steps)."""
        steps = 1 if prefill_tokens else self.rules.scheduler_steps
        return sum(s for _, s in self.host.before_launch(requests, prefill_tokens, steps))

    def batch(self, gpu_s: float, requests: int, prefill_tokens: int, graphed: bool) -> BatchHost:
        """The host around a batch of `requests` requests and `prefill_tokens` prompt
        tokens (graphed or not) whose trip from its launch to its outputs back takes
        `gpu_s`: its step by `compose` (the loop's CPU before the launch, the launch,
        vLLM V0's output processing, each where the release puts it), and every rank's
        loop time for it."""
        host, rules = self.host, self.rules
        prefill = prefill_tokens > 0
        before = self.before_s(requests, prefill_tokens)
        out = host.step(requests, prefill_tokens).out_step_s
        launch = host.launch_s(0, graphed, prefill)
        step = compose(
            gpu_s,
            StepHost(sched_s=before, prep_s=0.0, bcast_s=0.0, out_step_s=out),
            launch,
            overlap=rules.overlap,
            launch_on_loop=rules.launch_on_loop,
            async_output=rules.async_output,
        )
        ranks: tuple[float, ...] = (step.host_s,)
        if self.ranks_run_loop:  # each later rank runs the iteration and launches its stage
            ranks += tuple(before + host.launch_s(s, graphed, prefill) for s in range(1, self.pp))
        return BatchHost(step, before, ranks)

    def output_s(self, tokens: float) -> tuple[float, float]:
        """(detokenizer, API process) seconds for one returned step of `tokens` outputs:
        a client sees them after both (`HostCosts.output`)."""
        return self.host.output(round(tokens))

    def delay_s(self, tokens: float) -> float:
        """From a step's return to its clients seeing its `tokens`, neither process queued."""
        return sum(self.output_s(tokens))

    def busy(self, steps_per_s: float, tokens_per_step: float, requests_per_s: float) -> float:
        """The busier serial process's share of a second (1: saturated): the detokenizer
        per returned step, the API process per step and per request tokenised."""
        detok, stream = self.output_s(tokens_per_step)
        return max(steps_per_s * detok, steps_per_s * stream + requests_per_s * self.frontend_s)


def host_loop(host: HostCosts, settings: EngineSettings) -> HostLoop:
    """The host-loop terms of an engine run with `settings` on a cost model's host
    costs (`CostModel.host`): the release's rules from the settings, and whether every
    PP rank runs the scheduler loop (SGLang's slots, as sim/simulation.py decides)."""
    return HostLoop(host, settings.host, ranks_run_loop=settings.slots > 1)

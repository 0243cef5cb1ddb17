"""The engine's host loop as the steady-state model charges it: every CPU term the
simulation charges a micro-batch, a request or a returned step, taken from the
profile in one function, `host_loop`.

The simulation charges these terms in four places (docs/engines.md §1-§3, §6): the
scheduler's CPU per loop iteration (sim/simulation.py `cpu`, SGLang's every slot turn
while a batch is in flight, vLLM's every formed batch), the metadata relay per PP hop
(sim/pipeline.py `_rank_launch`, and `CostModel.hop_time`), the tokenizer per request
and the detokenizer per returned step and token (sim/frontend.py). The steady-state
model (steady_model.py) reads them only from the `HostLoop` this function returns, so
that a richer host-loop model (per-engine scheduler, input preparation, sampling,
detokenize, front end, eager launch terms) changes one function, not the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engines.protocol import EngineSettings
    from ..profiles.profile import Params


@dataclass(frozen=True)
class HostLoop:
    """The host's seconds per unit of work, as the simulation charges them."""

    iteration_s: float  # scheduler CPU per loop iteration (SGLang: per slot turn; vLLM: per formed batch)
    hop_s: float  # pickled metadata per PP hop per micro-batch (already inside CostModel.hop_time)
    frontend_s: float  # tokenizer + hand-off per request, one request at a time
    detokenize_step_s: float  # detokenizer per returned step, one step at a time
    detokenize_token_s: float  # detokenizer per output token of a returned step

    def detokenize_s(self, tokens: float) -> float:
        """The detokenizer's time for one returned step of `tokens` outputs."""
        return self.detokenize_step_s + self.detokenize_token_s * tokens


def host_loop(params: Params, settings: EngineSettings) -> HostLoop:
    """The host-loop terms of an engine run with `settings` on a profile's `params`.

    Today every engine's terms are the profile's parameters, as the simulation charges
    them; `settings` is taken so that per-engine terms (a scheduler's cost by batch
    size, vLLM's input preparation) plug in here."""
    del settings  # no per-engine term yet: the simulation charges none
    return HostLoop(
        iteration_s=params.cpu_iteration_ms * 1e-3,
        hop_s=params.cpu_hop_ms * 1e-3,
        frontend_s=params.frontend_ms * 1e-3,
        detokenize_step_s=params.detokenize_step_us * 1e-6,
        detokenize_token_s=params.detokenize_token_us * 1e-6,
    )

"""The engine's front end: where requests come from, which instance takes them, and
when a client hears back.

- Arrivals: a closed loop's C clients send their first requests at once and each its
  next one once its response has fully arrived; an open loop's arrivals come from its
  `ArrivalPlan` (drawn before any request length, workload.py); a trace's at its times.
- The API process (SGLang's TokenizerManager, vLLM's API server: one process) tokenises
  requests one at a time, `frontend_ms` each (docs/engines.md §1).
- With data-parallel ranks the engine's router picks the rank (engines/routing.py).
- The output path (docs/host-loop.md §2.2, §3.1): each returned step's tokens pass the
  detokenizer process (SGLang: `detokenize_step_us` + `detokenize_token_us` per token),
  then the API process's streaming (`stream_step_us` + `stream_token_us` per token, on
  the same serial clock as its tokenising), before a client sees them: its first token,
  its last, and a closed loop's next request wait for it. Each process is serial, so the
  output path caps output tokens per second at 1 / its slower per-token cost.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence

import numpy as np
import simpy

from ..costs.host import frontend_s, output_path_s
from ..engines.batches import Request
from ..engines.protocol import DPRouter
from ..inputs.workload import ArrivalPlan, Workload
from ..measure.rows import PROCESS_PARTS
from ..profiles.profile import Params
from .env import CountingEnvironment
from .instance import EngineInstance


class FrontEnd:
    """Arrivals, the tokenizer, routing and the detokenizer of one run."""

    def __init__(
        self, env: CountingEnvironment, workload: Workload, params: Params, stop: simpy.Event
    ) -> None:
        self.env, self.workload, self.stop = env, workload, stop
        self.rng = np.random.default_rng(workload.seed)
        # an open loop's arrival times, drawn before any request length (workload.py)
        self.plan = None if workload.kind == "closed" else ArrivalPlan(workload, self.rng)
        self.arrived = 0
        self.requests: list[Request] | None = None  # every request, when the run keeps them
        self.params = params
        self._tokenize_s = frontend_s(params)
        self._api_free_s = 0.0  # the API process: tokenising and streaming, one at a time
        self._detok_free_s = 0.0  # the detokenizer process
        # the host processes' rows by part (measure/rows.py HOST_PARTS), set by the simulation
        self.rows: dict[str, list] = {part: [] for part in PROCESS_PARTS}  # (kernel_launch: pipeline.py)
        self.instances: Sequence[EngineInstance] = ()
        self.router: DPRouter | None = None
        self.per_rank: list[int] = []  # requests routed to each DP rank
        self.routed: list[int] | None = None  # the rank of each request, by id (kept runs)
        self._note: Callable[[float], None] = _ignore

    def start(
        self,
        instances: Sequence[EngineInstance],
        router: DPRouter | None,
        note_arrival: Callable[[float], None],
        keep: bool,
    ) -> None:
        """Serve `instances` (through `router` when there are several), tell
        `note_arrival` each arrival time, keep every request if `keep`, and start the
        arrivals."""
        self.instances, self.router, self._note = instances, router, note_arrival
        self.per_rank = [0] * len(instances)
        if keep:
            self.requests = []
            self.routed = [] if router is not None else None
        self.env.process(self._arrivals())

    def _arrivals(self) -> Generator[simpy.Event, None, None]:
        w, env = self.workload, self.env
        if w.kind == "closed":
            for c in range(w.concurrency):
                self.arrive(c)
            return
        if w.kind == "poisson":
            assert self.plan is not None  # an open loop has its arrival plan
            for gap in self.plan.gaps():
                yield env.timeout(gap)
                self.arrive()
            return
        for arrival_s, n_in, n_out in w.trace:
            if arrival_s > env.now:  # ArrivalPlan adds the times up the same way
                yield env.timeout(arrival_s - env.now)
            self.arrive(-1, n_in, n_out)

    def arrive(self, client: int = -1, input_len: int | None = None, output_len: int | None = None) -> None:
        """A request arrives now: lengths drawn (or given, a trace's), then tokenized."""
        w = self.workload
        if input_len is None:  # drawn in this order: input, then output
            input_len = int(w.input_len.sample(self.rng, 1)[0])
        if output_len is None:
            output_len = int(w.output_len.sample(self.rng, 1)[0])
        req = Request(self.arrived, self.env.now, input_len, output_len, client)
        self.arrived += 1
        if self.requests is not None:
            self.requests.append(req)
        self._note(req.arrival_s)
        if self._tokenize_s <= 0:
            self.enqueue(req)
            return
        # the API process handles requests one at a time, between its streaming
        start = max(self.env.now, self._api_free_s)
        done = self._api_free_s = start + self._tokenize_s
        self.rows["front_end"].append((start, done))
        self.env.call_at(done, lambda _ev: self.enqueue(req))

    def enqueue(self, req: Request) -> None:
        """The request reaches an instance's waiting queue (the router's pick)."""
        if self.router is None:
            self.instances[0].enqueue(req)
            return
        r = self.router.route(self.env.now, self.instances)
        self.per_rank[r] += 1
        if self.routed is not None:
            self.routed.append(r)
        self.instances[r].enqueue(req)

    def deliver(self, tokens: int) -> float:
        """When the clients see a step's `tokens`, returned now: after the detokenizer
        and then the API process have handled them, each in turn (free-at clocks, no
        event; each busy stretch a row)."""
        t = self.env.now
        detok_s, stream_s = output_path_s(self.params, tokens)
        if detok_s:
            start = max(t, self._detok_free_s)
            t = self._detok_free_s = start + detok_s
            self.rows["detokenizer"].append((start, t))
        if stream_s:
            start = max(t, self._api_free_s)
            t = self._api_free_s = start + stream_s
            self.rows["api_stream"].append((start, t))
        return t

    def respond(self, finished: list[Request], seen_s: float) -> None:
        """A closed loop's clients whose requests finished send their next ones once
        they have seen the last token, at `seen_s` (`deliver`; docs/engines.md §1)."""
        if seen_s > self.env.now:
            clients = [r.client for r in finished]
            self.env.call_at(seen_s, lambda _ev: self._resend(clients))
            return
        for r in finished:
            self.arrive(r.client)

    def _resend(self, clients: list[int]) -> None:
        if not self.stop.triggered:
            for c in clients:
                self.arrive(c)


def _ignore(_t: float) -> None:
    pass

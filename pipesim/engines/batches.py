"""What an engine schedules and the pipeline carries: a `Request` (its prompt, its
outputs so far, its KV and where it is) and a `MicroBatch` (the requests decoding and
the prompt chunks prefilling in one forward pass, its `Shape` for the cost model, and
the event of its return). Apart from simulation.py so that the engines' protocol
(engines/protocol.py) names them without importing the simulation."""

from __future__ import annotations

from collections import deque

import simpy

from ..costs.primitives import Shape


class Request:
    __slots__ = (
        "rid",
        "arrival_s",
        "input_len",
        "output_len",
        "prefilled",
        "scheduled",
        "generated",
        "slot",
        "first_token_s",
        "finish_s",
        "client",
        "kv_reserved",
        "inflight",
        "admit_s",
        "prefill_len",
        "evicted",
        "queued",
    )

    def __init__(self, rid: int, arrival_s: float, input_len: int, output_len: int, client: int = -1):
        self.rid, self.arrival_s, self.client = rid, arrival_s, client
        self.input_len, self.output_len = input_len, output_len
        self.prefilled = 0  # prompt tokens whose KV is computed (chunks back)
        self.scheduled = 0  # prompt tokens sent in chunks so far (some may be in flight)
        self.generated = 0  # output tokens produced
        self.slot = -1  # SGLang micro-batch slot (sticky once prefilled)
        self.first_token_s = -1.0
        self.finish_s = -1.0
        self.kv_reserved = 0
        self.inflight = 0  # batches in flight that carry this request
        self.admit_s = -1.0  # when the engine first admitted it (left the waiting queue)
        self.prefill_len = input_len  # tokens its (re-)prefill computes: prompt + outputs so far
        self.evicted = 0  # times the engine evicted it to free KV (retract / preempt)
        self.queued: deque | None = None  # evicted: the waiting queue it is back in

    @property
    def context(self) -> int:
        """Tokens in its KV cache once prefilled (an evicted request re-prefills its
        outputs with its prompt: prefill_len - input_len of them)."""
        return self.input_len + self.generated


# one prompt chunk of a micro-batch: (request, chunk tokens, prefix tokens before it)
PrefillChunk = tuple[Request, int, int]


class MicroBatch:
    __slots__ = (
        "seq",
        "slot",
        "decode",
        "prefill",
        "shape",
        "returned",
        "it",
        "cpu_launch_s",
        "rank",
        "host_s",
    )

    def __init__(
        self,
        seq: int,
        slot: int,
        decode: list,
        prefill: list,
        env: simpy.Environment,
        graphed: bool,
        pad: int = 0,
    ):
        self.seq, self.slot = seq, slot
        self.decode = decode  # requests decoding one token
        self.prefill = prefill  # (request, chunk tokens, prefix tokens)
        # a graphed batch runs at its padded size: `pad` dummy decode rows, whose
        # (near-empty) contexts add no attention work, so the mean context is over all rows
        rows = len(decode) + pad
        ctx = sum(r.input_len + r.generated for r in decode) // rows if decode else 0  # mean `context`
        self.shape = Shape(rows, ctx, tuple((c, p) for _, c, p in prefill), graphed)
        self.returned = env.event()
        self.it = 0  # the scheduler's slot iteration that launched it (SGLang PP)
        self.cpu_launch_s = env.now  # when the previous rank's CPU launched it
        self.rank = 0  # the data-parallel rank whose scheduler formed it (dataparallel.py)
        self.host_s = 0.0  # CPU of the iteration that formed it, on every PP rank's loop (SGLang)

    @property
    def size(self) -> int:
        return len(self.decode) + len(self.prefill)

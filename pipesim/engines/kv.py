"""KV-cache bookkeeping shared by the engines: memory is taken when a batch is formed
and given back when a request finishes or is evicted (docs/engines.md §4).

The simulation keeps the pool (`kv_free`, tokens) and frees a finished request's
`kv_reserved`; an engine takes tokens for the work it schedules with `take`, in its
own unit (SGLang: tokens, page size 1; vLLM: whole blocks), and evicts a running
request with `Simulation.requeue` (SGLang `retract_decode`, vLLM recompute
preemption), which gives its memory back and returns it to the waiting queue.

SGLang's admission estimate (`NewTokenRatio`) lives here too: its constants are the
engine's environment defaults (python/sglang/srt/environ.py, read at 00ff98d3; the
same values were `global_config` defaults in earlier trees).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .batches import Request
    from .protocol import EngineSimulation

# SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION,
# SGLANG_RETRACT_DECODE_STEPS (docs/engines.md §4)
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20

# vLLM's default KV block size on CUDA (CacheConfig.block_size, docs/engines.md §4)
VLLM_BLOCK_SIZE = 16


def take(sim: EngineSimulation, req: Request, tokens: int) -> None:
    """Give `req` `tokens` more KV-cache tokens from the pool (the caller checked room)."""
    req.kv_reserved += tokens
    sim.kv_free -= tokens


def blocks_for(tokens: int, block_size: int = VLLM_BLOCK_SIZE) -> int:
    """Blocks that hold `tokens` (`KVCacheManager.allocate_slots` rounds up:
    cdiv(num_computed + num_new, block_size))."""
    return -(-tokens // block_size)


class NewTokenRatio:
    """SGLang's estimate of the share of a running request's remaining output that it
    will still need KV for (`Scheduler.init_new_token_ratio` and
    `update_running_batch`, docs/engines.md §4):

    - starts at `init` = SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness (at
      most 1), with floor `min` = init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR;
    - every decode batch that needs no retraction lowers it by
      (init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, down to the floor;
    - a retraction sets it to `retract_decode`'s new estimate;
    - an idle server resets it to `init`.
    """

    __slots__ = ("init", "floor", "decay", "value")

    def __init__(self, schedule_conservativeness: float = 1.0):
        self.init = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.floor = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.floor) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def step(self) -> None:
        """A decode batch went ahead without retraction."""
        self.value = max(self.value - self.decay, self.floor)

    def reset(self) -> None:
        """The server went idle."""
        self.value = self.init


def retract_estimate(remaining: list[Request]) -> float:
    """`retract_decode`'s new ratio from the requests it keeps: (tokens decoded +
    SGLANG_RETRACT_DECODE_STEPS x requests) / (their max_new_tokens + 1), at most 1
    (older trees divided by the sum alone)."""
    decoded = sum(r.generated for r in remaining)
    max_new = sum(r.output_len for r in remaining)
    return min(1.0, (decoded + RETRACT_DECODE_STEPS * len(remaining)) / (max_new + 1))


def decode_memory(sim: EngineSimulation, running: list[Request], ratio: NewTokenRatio) -> bool:
    """SGLang's `update_running_batch` (docs/engines.md §4): a decode step needs one KV
    token per request (page size 1, `check_decode_mem`); without them `retract_decode`
    evicts requests, else the ratio decays. Takes the step's tokens; False when not even
    one request can decode (SGLang asserts there)."""
    if sim.kv_free < len(running):
        retract_decode(sim, running, ratio)
    else:
        ratio.step()
    if sim.kv_free < len(running):
        return False
    for r in running:  # take of one token each, inlined: once per request per step
        r.kv_reserved += 1
    sim.kv_free -= len(running)
    return True


def retract_decode(sim: EngineSimulation, running: list[Request], ratio: NewTokenRatio) -> None:
    """`ScheduleBatch.retract_decode`: order by (outputs, -prompt) descending and evict
    from the end (fewest outputs, then longest prompt) until the rest can decode one
    step, at least one and never the last; the evicted free their KV and join the back
    of the waiting queue (`_extend_requests_to_queue`), to re-prefill prompt and
    outputs; the ratio becomes `retract_estimate` of the kept."""
    keep = sorted(running, key=lambda r: (r.generated, -r.input_len), reverse=True)
    first = True
    while (first or sim.kv_free < len(keep)) and len(keep) > 1:
        first = False
        r = keep.pop()
        r.slot = -1
        sim.requeue(r, front=False)
    running[:] = [r for r in running if r.queued is None]
    ratio.value = retract_estimate(running)


class FreeBlockQueue:
    """vLLM's free block queue with prefix caching on (docs/engines.md §4), in tokens of
    whole blocks: free memory in the order it was freed, the oldest first. A new
    allocation evicts from the front (the never-used pool, then memory in the order it
    was freed); a preempted request's blocks keep their hashes while free, so when it
    resumes its own prefix is still cached, short of what was evicted meanwhile (a
    request's blocks are freed last block first, so eviction shortens its prefix).

    `segments` holds [owner, tokens] in free order (owner: the preempted request's rid,
    or None for memory nobody will hit: never used, or a finished request's); their
    sum is the pool's free memory."""

    __slots__ = ("segments", "cached")

    def __init__(self, tokens: int):
        self.segments: list[list] = [[None, tokens]] if tokens else []
        self.cached: dict[int, int] = {}  # rid -> tokens of its prefix still cached

    def free(self, tokens: int, owner: int | None = None, cached: int = 0) -> None:
        """`tokens` go back at the end of the queue; `cached` of them (whole blocks of
        computed tokens) stay a prefix of request `owner`."""
        if tokens:
            self.segments.append([owner if cached else None, tokens])
        if owner is not None and cached:
            self.cached[owner] = min(cached, tokens)

    def hit(self, rid: int) -> int:
        """Tokens of `rid`'s own prefix still cached (0 if none)."""
        return self.cached.get(rid, 0)

    def take(self, tokens: int, rid: int | None = None, hit: int = 0) -> None:
        """Allocate `tokens`: `hit` of them are `rid`'s cached blocks (touched, they
        leave the queue), the rest come from the front (evicting cached prefixes)."""
        if rid is not None:
            self._forget(rid, hit)
        rest = tokens - hit
        while rest > 0 and self.segments:
            seg = self.segments[0]
            used = min(rest, seg[1])
            seg[1] -= used
            rest -= used
            if seg[0] is not None:
                self.cached[seg[0]] = min(self.cached.get(seg[0], 0), seg[1])
            if seg[1] == 0:
                self.segments.pop(0)
                if seg[0] is not None:
                    self.cached.pop(seg[0], None)

    def drop(self, rid: int) -> None:
        """`rid` will not resume (it finished): its blocks are plain free memory."""
        self._forget(rid, 0)

    def _forget(self, rid: int, touched: int) -> None:
        self.cached.pop(rid, None)
        for i, seg in enumerate(self.segments):
            if seg[0] == rid:
                seg[1] -= touched
                seg[0] = None
                if seg[1] == 0:
                    self.segments.pop(i)
                break

    @property
    def tokens(self) -> int:
        """Free tokens in the queue (equals the pool's free memory)."""
        return sum(s[1] for s in self.segments)

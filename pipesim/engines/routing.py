"""Data parallelism's front end: which DP rank an arriving request goes to
(docs/engines.md §8). Each engine's rule is a router its settings hand out
(`EngineSettings.router`); the simulation asks it once per request.

- SGLang `DataParallelController` (python/sglang/srt/managers/data_parallel_controller.py,
  `round_robin_scheduler`, the default `--load-balance-method round_robin`): rank
  after rank.
- vLLM `DPLBAsyncMPClient.get_core_engine_for_request` (vllm/v1/engine/core_client.py):
  the rank with the lowest waiting x 4 + running, first index on a tie, from the
  [waiting, running] counts the `DPCoordinator` republishes at most every 100 ms
  (vllm/v1/engine/coordinator.py, `min_stats_update_interval_ms`); the front end then
  counts one more waiting request on its pick until the next update.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

# vLLM's DPCoordinator republishes the engines' [waiting, running] counts at most this often
LB_REFRESH_S = 0.1
# DPLBAsyncMPClient.get_core_engine_for_request: score = waiting x 4 + running
LB_WAITING_WEIGHT = 4


class RankLoad(Protocol):
    """What a router reads of a DP rank."""

    waiting: deque
    running: int


class RoundRobin:
    """SGLang's round-robin data-parallel controller."""

    def __init__(self, dp: int) -> None:
        self.dp = dp
        self._next = 0

    def route(self, now_s: float, ranks: Sequence[RankLoad]) -> int:
        r, self._next = self._next, (self._next + 1) % self.dp
        return r


class LeastLoaded:
    """vLLM's load-balancing front end over the coordinator's counts."""

    def __init__(self, dp: int) -> None:
        self.dp = dp
        self.counts: list[list[int]] | None = None  # [waiting, running] per rank, as last published
        self.published_s = 0.0

    def route(self, now_s: float, ranks: Sequence[RankLoad]) -> int:
        if self.counts is None or now_s - self.published_s >= LB_REFRESH_S:
            self.counts = [[len(k.waiting), k.running] for k in ranks]
            self.published_s = now_s
        lb = self.counts
        best = min(range(self.dp), key=lambda i: (LB_WAITING_WEIGHT * lb[i][0] + lb[i][1], i))
        lb[best][0] += 1
        return best

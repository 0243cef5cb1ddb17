"""CUDA graphs: the batch sizes each engine captures and the size a batch is padded to
(docs/engines.md §5). A graphed batch runs at its padded size; a batch above every
captured size runs eagerly (its kernels launched one by one: costs/host.py)."""

from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache


@lru_cache(maxsize=64)
def sglang_capture_sizes(max_bs: int) -> tuple[int, ...]:
    """Decode batch sizes SGLang captures CUDA graphs for, up to `cuda_graph_max_bs`
    (server_args.py `_generate_cuda_graph_batch_sizes`, no speculative decoding;
    docs/engines.md §5)."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return tuple(b for b in sizes if b <= max_bs)


def padded_size(sizes: tuple[int, ...], n: int) -> int:
    """The captured size a batch of `n` is padded to (`bisect_left`, as the graph
    runners do), or 0 when `n` is above every captured size (eager)."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else 0


# vllm/config/vllm.py `_set_cudagraph_sizes`: the largest capture size by default is
# min(max_num_seqs x 2, 512), and no larger than max_num_batched_tokens
CUDAGRAPH_MAX_TOKENS = 512


def vllm_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """Token counts vLLM captures CUDA graphs for by default
    ([1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16); docs/engines.md §5)."""
    top = min(max_num_seqs * 2, CUDAGRAPH_MAX_TOKENS, max_num_batched_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return tuple(b for b in sizes if b <= top)

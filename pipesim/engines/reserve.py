"""What each engine holds back from GPU memory before its KV pool, by version
(docs/engines.md §9; inputs/memory.py applies the rule).

SGLang (python/sglang/srt/model_executor/model_runner.py `init_torch_distributed`,
model_runner_kv_cache_mixin.py `profile_max_num_token` / `init_memory_pool`, 0.5.x; the
same formula since 2024): `total_gpu_memory` is the free memory measured after the
distributed init (CUDA context, NCCL communicators, custom all-reduce buffers already
taken), and the pool is `free after loading - total_gpu_memory x (1 - mem_fraction_static)`,
i.e. `fraction x (memory - context - communicators) - weights`: against `memory x
fraction - weights`, the fraction's share of the context and communicators is held back.
Activations and CUDA graphs live in the rest (`_handle_gpu_memory_settings` sized the
fraction for them). `--max-total-tokens` caps the pool; PP ranks take the smallest
(an all-reduce MIN); a pool of no tokens is "Not enough memory. Please try to increase
--mem-fraction-static."

vLLM V1 (vllm/v1/worker/gpu_worker.py `init_device`, `determine_available_memory`;
vllm/utils/mem_utils.py `memory_profiling`; read at 35d5cda1): the budget is `memory x
gpu_memory_utilization`, refused at start when the free memory then is below it. The pool
is that budget less the weights, the torch peak of `profile_run` (a dummy forward of
`max_num_batched_tokens` tokens over min(max_num_seqs, max_num_batched_tokens) dummy
requests, then on the last PP rank `_dummy_sampler_run` over those requests' rows with
temperature, top-k and top-p set: inputs/activations.py and `sampler_bytes`), and the
non-torch memory that grew during it; a pool of no blocks is "No available memory for the
cache blocks". What changed, by release:
- the start-up snapshot is taken after NCCL's init from vllm PR #25359 (opened 2025-09-22;
  taken here from the 0.11 line): before, the communicators grew during profiling and
  were held inside the budget;
- the sampler: the PyTorch sort unless a top-k/top-p kernel runs. FlashInfer's kernel
  was the default where FlashInfer was installed (vllm PR #11394, 2024-12), which the CUDA
  wheels did by 0.11.0 (PR #26859: "flashinfer-python is a default dep of vLLM CUDA now")
  until that PR made it opt-in (2025-10-15, after 0.11.0); a Triton kernel for 8 rows or
  more (PR #33538, opened 2026-02-02) and FlashInfer by default again (PR #40376, 2026)
  followed, their first releases not pinned here. pipesim takes the kernel for 0.11.0 and
  from 0.19 (its shipped vLLM profile), the sort for every other release (its A100
  profile is 0.14);
- the CUDA graphs: vllm PR #30515 (2025-12) captures them during profiling and subtracts
  their estimate when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is set, the default from
  0.21 ("Enabled by default as of v0.21.0", vllm/envs.py).
A profile that does not say its version takes the newest rules. V0 (the default before
0.8) sized its pool otherwise and is not modelled: its runs take the V1 rule of 0.10.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..inputs.activations import ACT_BYTES, forward_peak_bytes
from ..inputs.memory import MemoryRule

if TYPE_CHECKING:
    from ..inputs.box import Box
    from ..inputs.model import Model
    from ..inputs.plan import Plan

GiB, MiB = 2**30, 2**20

# Memory an engine's process holds before its distributed init: the CUDA context and the
# kernel libraries it loads. SGLang logs it ("Load weight begin. avail mem=" after "Init
# torch distributed ends. mem usage="): 140.40 - 137.29 - 2.01 = 1.10 GiB on an H200
# (sglang PR #11716's log, TP8), 95.59 - 94.01 - 0.39 = 1.19 GiB on an RTX PRO 6000
# Blackwell (sglang issue #40558's log, TP4); pipesim takes their mean.
CONTEXT_BYTES = 1.15 * GiB
# NCCL communicators and custom all-reduce buffers per GPU, the same logs' "Init torch
# distributed ends. mem usage=": 2.01 GiB at TP8 over NVLink (H200, custom all-reduce on),
# 0.39 GiB at TP4 over PCIe (NCCL 2.29.7, no custom all-reduce beyond two PCIe GPUs);
# taken for every group size on that interconnect, 0 on one GPU.
COMM_BYTES = {"nvlink": 2.01 * GiB, "pcie": 0.39 * GiB}
# vLLM's non-torch memory grown during profiling once NCCL is in the snapshot: 0.07 GiB
# ("0.07 GiB for non-torch memory", vllm PR #21489's log, gemma-3-4b on one GPU).
VLLM_NON_TORCH_BYTES = 0.07 * GiB
# `_dummy_sampler_run` per logit (row x vocab entry), alive at once. The PyTorch sort
# (vllm/v1/sample/sampler.py `Sampler.forward`, ops/topk_topp_sampler.py
# `apply_top_k_top_p`, read at 3e342658 and 3babc05a): the model's bf16 logits 2, their
# float32 copy 4, the sorted values 4 and int64 indices 8, the sorted softmax 4 (cumsum in
# place), two boolean masks 1 + 1, the scattered logits 4 = 28 (torch.sort's scratch not
# counted). A top-k/top-p kernel (FlashInfer's `top_k_top_p_sampling_from_logits`: masked
# logits then their softmax; or the Triton kernel in place, then the softmax and
# `random_sample`'s noise): bf16 2 + float32 4 + 4 + 4 = 14.
SORT_SAMPLER_BYTES, KERNEL_SAMPLER_BYTES = 28, 14
# Per CUDA graph in vLLM's estimate beyond the largest graph's activations: 0.36 GiB for
# 16 piecewise graphs of at most 16 tokens (gpustack/runner PR #251's vLLM 0.27.1 log,
# "Estimated CUDA graph memory: 0.36 GiB total") = 23 MiB each; vllm issue #50780 puts a
# FULL graph at ~24 MiB.
VLLM_GRAPH_BYTES = 23 * MiB
VLLM_GRAPH_ESTIMATE_FROM = (0, 21)
VLLM_NCCL_OUT_OF_BUDGET_FROM = (0, 11)
VLLM_KERNEL_SAMPLER = ((0, 11, 0), (0, 19, 0))  # the one release, and from


def version_tuple(version: str) -> tuple[int, ...] | None:
    """(0, 19, 0) from "0.19.0" or "v0.19.0" (a suffix such as .post1 or rc1 dropped);
    None when unknown."""
    parts = []
    for p in version.strip().removeprefix("v").split("."):
        digits = "".join(c for c in p if c.isdigit()) if p[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def sampler_bytes(version: str) -> int:
    """Bytes per logit vLLM's dummy sampler holds at `version` (the module docstring); a
    version not stated takes the newest rule."""
    v = version_tuple(version)
    if v is None:
        return KERNEL_SAMPLER_BYTES
    v3 = (v + (0, 0, 0))[:3]
    only, since = VLLM_KERNEL_SAMPLER
    return KERNEL_SAMPLER_BYTES if v3 == only or v3 >= since else SORT_SAMPLER_BYTES


def startup_bytes(box: Box, plan: Plan) -> tuple[float, float]:
    """(CUDA context, communicators) on each GPU before an engine loads its weights."""
    talking = plan.tp * plan.pp * (plan.dp if plan.moe_spans_dp else 1)
    link = "nvlink" if box.interconnect.startswith("NVLink") else "pcie"
    return CONTEXT_BYTES, COMM_BYTES[link] if talking > 1 else 0.0


def sglang_rule(fraction: float, box: Box, plan: Plan, max_total_tokens: int | None) -> MemoryRule:
    """SGLang's pool: fraction x (memory - context - communicators) - weights, capped."""
    context, comm = startup_bytes(box, plan)
    held = (("context and communicators x fraction", fraction * (context + comm)),)
    return MemoryRule(
        engine="SGLang",
        rule="mem_fraction_static x (memory - CUDA context - communicators) - weights "
        "(model_runner.py profile_max_num_token, init_memory_pool)",
        fraction=fraction,
        fraction_flag="--mem-fraction-static",
        budget_bytes=box.gpu.memory_bytes * fraction,
        held=(held,) * plan.pp,
        token_cap=max_total_tokens,
    )


def vllm_rule(
    utilization: float,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    graph_sizes: tuple[int, ...],
    box: Box,
    plan: Plan,
    model: Model,
    version: str,
) -> MemoryRule:
    """vLLM's pool at `version`: memory x utilization - weights - activation peak - non-torch
    memory (with the communicators before 0.11), less the CUDA-graph estimate from 0.21
    (`graph_sizes` empty: eager)."""
    v = version_tuple(version)
    graphs = bool(graph_sizes) and (v is None or v >= VLLM_GRAPH_ESTIMATE_FROM)
    rows = min(max_num_seqs, max_num_batched_tokens)
    context, comm = startup_bytes(box, plan)
    comm_inside = v is not None and v < VLLM_NCCL_OUT_OF_BUDGET_FROM
    per_logit = sampler_bytes(version)
    held = []
    for s in range(plan.pp):
        peak = forward_peak_bytes(model, plan, s, max_num_batched_tokens)
        if s == plan.pp - 1:
            # the sampler's phase: the forward's hidden states kept, each row's hidden state and
            # its random stand-in (`torch.rand_like`), and every row's logits
            hidden = ACT_BYTES * (max_num_batched_tokens + 2 * rows) * model.hidden
            peak = max(peak, hidden + rows * model.vocab * per_logit)
        parts = [("activation peak", peak), ("non-torch memory", VLLM_NON_TORCH_BYTES)]
        if comm_inside and comm:
            parts.append(("communicators", comm))
        if graphs:
            full = sum(1 for b in graph_sizes if b <= max_num_seqs)  # FULL_AND_PIECEWISE: two per decode size
            count = len(graph_sizes) + full
            pool = forward_peak_bytes(model, plan, s, max(graph_sizes))
            parts.append(("CUDA graphs", pool + count * VLLM_GRAPH_BYTES))
        held.append(tuple(parts))
    memory = box.gpu.memory_bytes
    budget = memory * utilization
    before = context + (0 if comm_inside else comm)  # in use at the start-up snapshot
    free = memory - before
    refusal = ""
    if free < budget:
        refusal = (
            f"vLLM would refuse to start: after the CUDA context{'' if comm_inside else ' and communicators'} "
            f"({before / GiB:.2f} GiB) {free / GiB:.1f} GiB of the {memory / GiB:.1f} GiB on each "
            f"{box.gpu.name} is free, less than --gpu-memory-utilization {utilization} asks "
            f"({budget / GiB:.1f} GiB; vllm gpu_worker.py init_device); lower --gpu-memory-utilization"
        )
    return MemoryRule(
        engine="vLLM",
        rule="gpu_memory_utilization x memory - weights - profile_run's activation peak - non-torch memory"
        + (" - CUDA graphs" if graphs else "")
        + " (v1/worker/gpu_worker.py determine_available_memory)",
        fraction=utilization,
        fraction_flag="--gpu-memory-utilization",
        budget_bytes=budget,
        held=tuple(held),
        refusal=refusal,
    )

#!/usr/bin/env python3
"""Time vLLM V1's scheduler on this CPU, with no GPU: `Scheduler.schedule()` and
`Scheduler.update_from_output()` (vllm/v1/core/sched/scheduler.py), the two calls the
engine core's busy loop makes per step (`EngineCore.step`), driven with synthetic
requests and a fake model output (one sampled token per running request).

Conditions: `running` requests decoding (1 ... 1024), each step either pure decode
(step tokens = running) or with one new request of P prompt tokens admitted and
prefilled in the same step (step tokens = running + P; the request is aborted after the
step, untimed, so `running` stays constant). Prefix caching and chunked prefill are at
V1's defaults (on). The KV pool is large enough that nothing is preempted.

    pip install vllm==0.10.1.1      # any V1 release; the script adapts to its signatures
    python calibration/host/vllm_v1_scheduler.py --out vllm_v1_scheduler.csv

Each condition is timed in `--reps` blocks of `--steps` consecutive steps; the CSV has
one row per block (median, p10, p90 of the block's calls, microseconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from _common import Rows, add, cpu_name, model_dir, settle, timed  # noqa: E402

BLOCK = 16


def use_cpu_platform():
    """No GPU here: make vLLM's platform the CPU one, so that the config checks that ask the
    platform (async output, device type) answer; the scheduler itself never asks."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


def build_scheduler(
    max_seqs: int, budget: int, num_blocks: int, max_len: int, async_sched: bool, prefix: bool
):
    import torch

    use_cpu_platform()
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    sc = dict(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_len)
    sig = inspect.signature(SchedulerConfig)
    if "enable_chunked_prefill" in sig.parameters:
        sc["enable_chunked_prefill"] = True
    if "is_encoder_decoder" in sig.parameters:
        sc["is_encoder_decoder"] = False
    if async_sched:
        sc["async_scheduling"] = True
    mc = dict(model=model_dir(), dtype="bfloat16", seed=0, skip_tokenizer_init=True, max_model_len=max_len)
    model_config = ModelConfig(**mc)
    # V1 turns prefix caching on by default (EngineArgs resolves the config's None to True)
    cache_config = CacheConfig(
        block_size=BLOCK, gpu_memory_utilization=0.9, cache_dtype="auto", enable_prefix_caching=prefix
    )
    cache_config.num_gpu_blocks = num_blocks
    extra = {}
    try:  # no GPU here: name the device, else the config cannot infer one
        from vllm.config import DeviceConfig

        extra["device_config"] = DeviceConfig(device="cpu")
    except ImportError:
        pass
    vcfg = VllmConfig(
        scheduler_config=SchedulerConfig(**sc), model_config=model_config, cache_config=cache_config, **extra
    )
    spec_sig = inspect.signature(FullAttentionSpec)
    spec_kw = dict(block_size=BLOCK, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    if "use_mla" in spec_sig.parameters:
        spec_kw["use_mla"] = False
    spec = FullAttentionSpec(**spec_kw)
    kv = dict(num_blocks=num_blocks, kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    kv_fields = {f.name for f in dataclasses.fields(KVCacheConfig)}
    if "kv_cache_tensors" in kv_fields:
        kv["kv_cache_tensors"] = []
    if "tensors" in kv_fields:
        kv["tensors"] = {}
    kv_config = KVCacheConfig(**kv)
    print(
        f"scheduler config: chunked prefill {vcfg.scheduler_config.chunked_prefill_enabled}, "
        f"prefix caching {vcfg.cache_config.enable_prefix_caching}, "
        f"max_num_seqs {vcfg.scheduler_config.max_num_seqs}, "
        f"max_num_batched_tokens {vcfg.scheduler_config.max_num_batched_tokens}",
        file=sys.stderr,
    )
    kw = dict(vllm_config=vcfg, kv_cache_config=kv_config, log_stats=True)
    ssig = inspect.signature(Scheduler.__init__).parameters
    if "structured_output_manager" in ssig:
        from vllm.v1.structured_output import StructuredOutputManager

        kw["structured_output_manager"] = StructuredOutputManager(vcfg)
    if "block_size" in ssig:
        kw["block_size"] = BLOCK
    if async_sched:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        return AsyncScheduler(**kw)
    return Scheduler(**kw)


class Requests:
    """Builds V1 `Request`s with whatever arguments this version's constructor takes."""

    def __init__(self):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        self.Request, self.SamplingParams = Request, SamplingParams
        self.params = set(inspect.signature(Request.__init__).parameters)
        self.hasher = None
        try:  # releases with request-side block hashing (0.10.2 and later)
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            try:
                init_none_hash(hash)
            except TypeError:
                init_none_hash()
            self.hasher = get_request_block_hasher(BLOCK, hash)
        except ImportError:
            pass
        self.n = 0

    def make(self, prompt_len: int, max_tokens: int):
        self.n += 1
        sp = self.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        if hasattr(sp, "update_from_generation_config"):
            pass
        # distinct prompts (no prefix shared between requests)
        base = (self.n * 7919) % 120000
        kw = dict(
            request_id=f"r{self.n}",
            prompt_token_ids=[(base + i) % 128000 for i in range(prompt_len)],
            sampling_params=sp,
            pooling_params=None,
            eos_token_id=128001,
        )
        for k in (
            "multi_modal_kwargs",
            "multi_modal_hashes",
            "multi_modal_placeholders",
            "mm_features",
            "mm_inputs",
        ):
            if k in self.params:
                kw[k] = None
        if "block_hasher" in self.params and self.hasher is not None:
            kw["block_hasher"] = self.hasher
        if "arrival_time" in self.params:
            kw["arrival_time"] = 0.0
        return self.Request(**kw)


def fake_output(sched, sched_out, token: int):
    """A ModelRunnerOutput with one sampled token for every request that reached the end of
    its prompt in this step (a partial prefill chunk samples nothing)."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sched_out.num_scheduled_tokens)
    fields = {f.name: f for f in dataclasses.fields(ModelRunnerOutput)}
    done = [sched.requests[r].num_computed_tokens >= sched.requests[r].num_prompt_tokens for r in req_ids]
    kw = dict(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[token] if d else [] for d in done],
    )
    for name, f in fields.items():
        if name in kw or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        kw[name] = {} if "dict" in name else ([] if name == "pooler_output" else None)
    return ModelRunnerOutput(**kw)


def step(sched, token: int):
    so, t_s = timed(sched.schedule)
    mro = fake_output(sched, so, token)
    _, t_u = timed(sched.update_from_output, so, mro)
    return so, t_s, t_u


def run(args, rows: Rows):
    max_running = max(args.running)
    max_len = args.prompt + args.steps * args.reps * (len(args.prefill) + 1) + 4096
    blocks = (max_running + 2) * (max_len // BLOCK + 1)
    budget = max(args.budget, max_running + max(args.prefill, default=0))
    sched = build_scheduler(
        max_running + 1, budget, blocks, max_len, args.async_scheduling, not args.no_prefix_caching
    )
    reqs = Requests()
    token = 1000
    for running in sorted(args.running):
        # grow the running set to `running` requests, all past their prefill
        while len(sched.running) + len(sched.waiting) < running:
            sched.add_request(reqs.make(args.prompt, max_tokens=10**6))
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running) or sched.waiting:
            step(sched, token)
        for _ in range(3):  # warm-up
            step(sched, token)
        for p in [0] + list(args.prefill):
            for rep in range(args.reps):
                settle()
                t_sched, t_upd = [], []
                for _ in range(args.steps):
                    new = None
                    if p:
                        new = reqs.make(p, max_tokens=10**6)
                        sched.add_request(new)
                    so, ts, tu = step(sched, token)
                    t_sched.append(ts)
                    t_upd.append(tu)
                    if new is not None:
                        assert so.num_scheduled_tokens.get(new.request_id) == p, "prefill not in one chunk"
                        from vllm.v1.request import RequestStatus

                        sched.finish_requests(new.request_id, RequestStatus.FINISHED_ABORTED)
                tag = "async_" if args.async_scheduling else ""
                rows.add(f"{tag}schedule", running, running + p, rep, t_sched)
                rows.add(f"{tag}update_from_output", running, running + p, rep, t_upd)
                rows.add(
                    f"{tag}schedule+update",
                    running,
                    running + p,
                    rep,
                    [add(a, b) for a, b in zip(t_sched, t_upd)],
                )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--running", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128, 512, 1024]
    )
    ap.add_argument("--prefill", type=lambda s: [int(x) for x in s.split(",") if x], default=[512, 2048])
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens of the running requests")
    ap.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--async-scheduling", action="store_true", help="time AsyncScheduler instead")
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--out", default="vllm_v1_scheduler.csv")
    args = ap.parse_args()
    import vllm

    print(f"vLLM {vllm.__version__} on {cpu_name()}", file=sys.stderr)
    rows = Rows("vllm-v1", vllm.__version__)
    run(args, rows)
    rows.write(args.out)


if __name__ == "__main__":
    main()

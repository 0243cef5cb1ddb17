#!/usr/bin/env python3
"""Time SGLang's scheduler loop on this CPU, with no GPU: the engine's own
`Scheduler.get_next_batch_to_run` (prefill admission through `PrefillAdder`, or
`update_running_batch`: filter, `check_decode_mem`, `prepare_for_decode`),
`ScheduleBatch.get_model_worker_batch`, and `Scheduler.process_batch_result` (append the
sampled tokens, stop checks, `stream_output` building the `BatchTokenIDOut` for the
detokenizer, which is pickled as `send_pyobj` would), plus the
`DetokenizerManager.handle_batch_token_id_out` that turns that message into text.

The model never runs: a fake result with one sampled token per request stands in for
`run_batch`. The scheduler object is the engine's `Scheduler` class with the state its
`__init__` would set for a CPU device (pools on the CPU, a radix cache, the
non-overlap path: the overlap path runs the same CPU code one batch ahead). Tensor
operations that would be kernel launches on a GPU run as CPU tensor operations here;
their cost differs from a GPU launch (see the README).

    pip install sglang==0.5.2   # the CPU-side modules; no GPU build needed to import them
    python calibration/host/sglang_scheduler.py --out sglang_scheduler.csv
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import Rows, cpu_name, model_dir, settle  # noqa: E402


class PickleSocket:
    """Stands for the ZMQ socket to the detokenizer: pickles what `send_pyobj` would send."""

    def __init__(self):
        self.last = None

    def send_pyobj(self, obj):
        self.last = pickle.dumps(obj)


def make_scheduler(max_running: int, pool_tokens: int, chunked_prefill: int):
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mdir = model_dir()
    sa = ServerArgs(model_path=mdir, device="cpu", attention_backend="torch_native", skip_tokenizer_init=True)
    try:
        from sglang.srt.managers.schedule_batch import global_server_args_dict

        global_server_args_dict.update({k: getattr(sa, k) for k in global_server_args_dict if hasattr(sa, k)})
    except ImportError:
        pass
    mc = ModelConfig.from_server_args(sa)
    s = Scheduler.__new__(Scheduler)
    s.server_args = sa
    s.model_config = mc
    s.is_generation = True
    s.enable_overlap = False
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.page_size = 1
    s.tp_rank = 0
    s.dp_size = 1
    s.max_running_requests = max_running
    s.max_total_num_tokens = pool_tokens
    s.max_req_len = pool_tokens
    s.max_req_input_len = pool_tokens
    s.req_to_token_pool = ReqToTokenPool(
        size=max_running + 8, max_context_len=8192, device="cpu", enable_memory_saver=False
    )
    kv = MHATokenToKVPool(
        pool_tokens,
        page_size=1,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
        pool_tokens, torch.bfloat16, "cpu", kv, need_sort=False
    )
    s.tree_cache = RadixCache(s.req_to_token_pool, s.token_to_kv_pool_allocator, page_size=1)
    s.policy = SchedulePolicy(sa.schedule_policy, s.tree_cache, sa.enable_hierarchical_cache)
    s.waiting_queue = []
    s.chunked_req = None
    s.last_batch = None
    s.cur_batch = None
    s.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
    s.chunked_prefill_size = chunked_prefill
    s.max_prefill_tokens = sa.max_prefill_tokens
    s.is_mixed_chunk = False
    s.grammar_queue = []
    s.enable_lora = False
    s.enable_metrics = False
    s.enable_hierarchical_cache = False
    s.enable_hicache_storage = False
    from sglang.srt.disaggregation.utils import DisaggregationMode

    s.disaggregation_mode = DisaggregationMode.NULL
    s.init_new_token_ratio = 0.7
    s.new_token_ratio = 0.7
    s.min_new_token_ratio = 0.1
    s.new_token_ratio_decay = 0.001
    s.decode_mem_cache_buf_multiplier = 1
    s.total_retracted_reqs = 0
    s.forward_ct = 0
    s.forward_ct_decode = 0
    s.num_generated_tokens = 0
    s.stream_interval = sa.stream_interval
    s.send_to_detokenizer = PickleSocket()
    s.current_stream = None
    s.tp_worker = None
    s.enable_kv_cache_events = False
    s.torch_profiler = None
    s.profile_in_progress = False
    s.return_health_check_ct = 0
    s.metrics_collector = None
    s.offload_tags = set()
    s.forward_sleep_time = None
    s.attn_tp_rank = 0
    s.pp_rank = 0
    s.pp_size = 1
    return s


def make_req(i: int, prompt_len: int, vocab: int):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=10**6, ignore_eos=True, temperature=0.0)
    sp.normalize(None)
    sp.verify(vocab) if sp.verify.__code__.co_argcount > 1 else sp.verify()
    base = (i * 7919) % 120000
    req = Req(f"r{i}", "", [(base + k) % 128000 for k in range(prompt_len)], sp)
    req.tokenizer = None
    return req


def fake_result(batch, token: int):
    from sglang.srt.managers.scheduler import GenerationBatchResult

    kw = dict(
        logits_output=None,
        pp_hidden_states_proxy_tensors=None,
        next_token_ids=[token] * batch.batch_size(),
        extend_input_len_per_req=None,
        extend_logprob_start_len_per_req=None,
        bid=0,
        can_run_cuda_graph=False,
    )
    import dataclasses

    names = {f.name for f in dataclasses.fields(GenerationBatchResult)}
    return GenerationBatchResult(**{k: v for k, v in kw.items() if k in names})


def one_iteration(s, token: int):
    """What `event_loop_normal` does per iteration, less recv and the model: returns the
    batch and the ns spent in (schedule, worker batch, process result)."""
    t0 = time.perf_counter_ns()
    batch = s.get_next_batch_to_run()
    s.cur_batch = batch
    t1 = time.perf_counter_ns()
    mwb = None
    if batch is not None:
        mwb = batch.get_model_worker_batch()
    t2 = time.perf_counter_ns()
    if batch is not None:
        res = fake_result(batch, token)
        s.process_batch_result(batch, res)
    t3 = time.perf_counter_ns()
    s.last_batch = batch
    return batch, mwb, (t1 - t0, t2 - t1, t3 - t2)


def run(args, rows: Rows):
    max_running = max(args.running)
    s = make_scheduler(max_running + 1, pool_tokens=(max_running + 2) * 4096, chunked_prefill=args.chunk)
    vocab = s.model_config.vocab_size
    n = 0
    token = 1000
    for running in sorted(args.running):
        while len(s.running_batch.reqs) + len(s.waiting_queue) < running:
            n += 1
            s.waiting_queue.append(make_req(n, args.prompt, vocab))
        # prefill them all; then a few decode iterations
        while s.waiting_queue or (s.last_batch is not None and s.last_batch.forward_mode.is_extend()):
            one_iteration(s, token)
        for _ in range(3):
            one_iteration(s, token)
        assert len(s.running_batch.reqs) == running, (len(s.running_batch.reqs), running)
        for rep in range(args.reps):
            settle()
            ts, tw, tp = [], [], []
            for _ in range(args.steps):
                batch, _, (a, b, c) = one_iteration(s, token)
                assert batch.forward_mode.is_decode()
                ts.append(a)
                tw.append(b)
                tp.append(c)
            rows.add("get_next_batch_to_run(decode)", running, running, rep, ts)
            rows.add("get_model_worker_batch", running, running, rep, tw)
            rows.add("process_batch_result_decode", running, running, rep, tp)
            rows.add(
                "decode_iteration_total", running, running, rep, [a + b + c for a, b, c in zip(ts, tw, tp)]
            )
        # a prefill admitted while `running` decode: SGLang runs it as its own batch
        for p in args.prefill:
            for rep in range(args.reps):
                settle()
                ts = []
                for _ in range(max(1, args.steps // 4)):
                    n += 1
                    s.waiting_queue.append(make_req(n, p, vocab))
                    batch, _, (a, b, c) = one_iteration(s, token)
                    assert batch.forward_mode.is_extend(), batch.forward_mode
                    ts.append(a + b + c)
                    # retire the new request before the next sample: finish it and let the loop
                    # merge and filter it (untimed)
                    for r in batch.reqs:
                        r.sampling_params.max_new_tokens = len(r.output_ids)
                        r.finished_reason = None
                    one_iteration(s, token)
                    one_iteration(s, token)
                rows.add("prefill_iteration_total", running, p, rep, ts)
            assert len(s.running_batch.reqs) == running, (len(s.running_batch.reqs), running)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--running", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128, 512, 1024]
    )
    ap.add_argument("--prefill", type=lambda s: [int(x) for x in s.split(",") if x], default=[512, 2048])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=8192, help="chunked_prefill_size")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="sglang_scheduler.csv")
    args = ap.parse_args()
    import sglang
    import torch

    torch.set_num_threads(1)  # a scheduler process's tensors are on the GPU; keep CPU ops single-threaded
    print(f"SGLang {sglang.__version__} on {cpu_name()}", file=sys.stderr)
    rows = Rows("sglang", sglang.__version__)
    run(args, rows)
    rows.write(args.out)


if __name__ == "__main__":
    main()

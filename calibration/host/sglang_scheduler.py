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
# batch decoding in the tokenizers library fans out over threads, which the calling
# thread's CPU clock does not see: time it on one thread (the CPU work it costs)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import Clock, Rows, add, cpu_name, model_dir, settle  # noqa: E402


class PickleSocket:
    """Stands for the ZMQ socket to the detokenizer: pickles what `send_pyobj` would send."""

    def __init__(self):
        self.last = None

    def send_pyobj(self, obj):
        self.last = pickle.dumps(obj)


def no_gpu_triton():
    """SGLang's quantization modules decorate Triton kernels with an autotuner at import,
    which asks Triton's active driver for a benchmarker; with no GPU there is no driver.
    Give it one that can only answer that (no kernel runs here)."""
    try:
        import triton.runtime.driver as td
    except ImportError:
        return

    class NoGPU:
        def get_benchmarker(self):
            return lambda *a, **k: [0.0]

        def __getattr__(self, name):
            raise RuntimeError(f"no GPU driver here ({name})")

    cfg = td if hasattr(td, "set_active") else td.driver  # the module or its DriverConfig
    try:
        cfg.active.get_benchmarker()
    except Exception:
        cfg.set_active(NoGPU())


def stub_gpu_packages(prefixes=("sgl_kernel", "flashinfer")):
    """The GPU kernel packages SGLang imports at module level (never called on the
    scheduling path) are stood in for by empty modules when they are not installed."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    missing = [p for p in prefixes if importlib.util.find_spec(p) is None]
    if not missing:
        return

    class Stub(types.ModuleType):
        __path__ = []

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Stub(f"{self.__name__}.{name}")

        def __call__(self, *a, **k):
            raise RuntimeError(f"{self.__name__} is a stand-in: no GPU kernels here")

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in missing:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return Stub(spec.name)

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


def make_scheduler(max_running: int, pool_tokens: int, chunked_prefill: int):
    stub_gpu_packages()
    no_gpu_triton()
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
        # what Scheduler.__init__ derives: the per-batch cap (PP: per micro-batch)
        global_server_args_dict["max_micro_batch_size"] = max_running
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
    s.dp_rank = None
    s.is_hybrid = False
    s.device = "cpu"
    s.last_prefill_tokens = 0
    s.last_decode_stats_tic = s.last_prefill_stats_tic = time.perf_counter()
    s.init_metrics(0, 0, None)
    return s


def make_req(i: int, prompt_len: int, vocab: int, max_new_tokens: int = 10**6):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, temperature=0.0)
    sp.normalize(None)
    sp.verify(vocab) if sp.verify.__code__.co_argcount > 1 else sp.verify()
    base = (i * 7919) % 120000
    import inspect

    kw = {}
    params = inspect.signature(Req.__init__).parameters
    if "vocab_size" in params:
        kw["vocab_size"] = vocab
    if "eos_token_ids" in params:
        kw["eos_token_ids"] = {128001}
    if "stream" in params:
        kw["stream"] = True  # serving benchmarks stream: an output message every step
    req = Req(f"r{i}", "", [(base + k) % 128000 for k in range(prompt_len)], sp, **kw)
    req.tokenizer = None
    return req


TOKENS: list[int] = []  # the streamed token ids: an encoded text, cycled
STEP = [0]


def fake_result(batch, token: int):
    import torch

    if TOKENS:
        n = batch.batch_size()
        STEP[0] += 1
        ids = [TOKENS[(STEP[0] + 13 * k) % len(TOKENS)] for k in range(n)]
        return _result(torch.tensor(ids, dtype=torch.int64))
    return _result(torch.full((batch.batch_size(),), token, dtype=torch.int64))


def _result(next_token_ids):
    from sglang.srt.managers.scheduler import GenerationBatchResult

    kw = dict(
        logits_output=None,
        pp_hidden_states_proxy_tensors=None,
        next_token_ids=next_token_ids,
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
    batch and the (wall ns, cpu ns) spent in scheduling, building the worker batch, and
    processing the result."""
    with Clock() as c1:
        batch = s.get_next_batch_to_run()
        s.cur_batch = batch
    with Clock() as c2:
        if batch is not None:
            batch.get_model_worker_batch()
    with Clock() as c3:
        if batch is not None:
            res = fake_result(batch, token)
            batch.output_ids = res.next_token_ids  # as run_batch sets it
            s.process_batch_result(batch, res)
    s.last_batch = batch
    return batch, (c1.sample, c2.sample, c3.sample)


def make_detokenizer():
    """SGLang's DetokenizerManager with the state its __init__ sets, minus the sockets; the
    tokenizer is the offline byte-level BPE (see _common.byte_bpe_tokenizer)."""
    from _common import SAMPLE_TEXT, byte_bpe_tokenizer
    from sglang.srt.managers import detokenizer_manager as dmod
    from transformers import PreTrainedTokenizerFast

    tok, desc = byte_bpe_tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    TOKENS[:] = fast(SAMPLE_TEXT * 4, add_special_tokens=False)["input_ids"]
    dm = dmod.DetokenizerManager.__new__(dmod.DetokenizerManager)
    dm.tokenizer = fast
    dm.decode_status = dmod.LimitedCapacityDict(capacity=getattr(dmod, "DETOKENIZER_MAX_STATES", 1 << 16))
    dm.is_dummy = False
    dm.is_tool_call_parser_gpt_oss = False
    return dm, desc


def run(args, rows: Rows):
    max_running = max(args.running)
    stub_gpu_packages()
    no_gpu_triton()
    dm, desc = make_detokenizer()
    print(f"tokenizer: {desc}", file=sys.stderr)
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
                batch, (a, b, c) = one_iteration(s, token)
                assert batch.forward_mode.is_decode()
                ts.append(a)
                tw.append(b)
                tp.append(c)
            rows.add("get_next_batch_to_run(decode)", running, running, rep, ts)
            rows.add("get_model_worker_batch", running, running, rep, tw)
            rows.add("process_batch_result_decode", running, running, rep, tp)
            total = [add(add(a, b), c) for a, b, c in zip(ts, tw, tp)]
            rows.add("decode_iteration_total", running, running, rep, total)
        # the detokenizer process's work for the same steps: unpickle the scheduler's
        # BatchTokenIDOut, handle_batch_token_id_out, pickle the BatchStrOut it sends on
        for rep in range(args.reps):
            settle()
            td = []
            for _ in range(args.steps):
                one_iteration(s, token)
                msg = s.send_to_detokenizer.last
                with Clock() as c:
                    out = dm.handle_batch_token_id_out(pickle.loads(msg))
                    pickle.dumps(out)
                td.append(c.sample)
            rows.add("detokenizer_step", running, running, rep, td)
        # a prefill admitted while `running` decode: SGLang runs it as a batch of its own
        # (prefill first); the request asks for one token, so it finishes at its prefill
        # and the running set stays as it was
        for p in args.prefill:
            for rep in range(args.reps):
                settle()
                ts = []
                for _ in range(max(1, args.steps // 4)):
                    n += 1
                    s.waiting_queue.append(make_req(n, p, vocab, max_new_tokens=1))
                    batch, (a, b, c) = one_iteration(s, token)
                    assert batch.forward_mode.is_extend(), batch.forward_mode
                    ts.append(add(add(a, b), c))
                    one_iteration(s, token)  # the decode that follows (untimed)
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

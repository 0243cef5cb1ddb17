#!/usr/bin/env python3
"""Time vLLM V0's engine-loop CPU work on this CPU, with no GPU (vLLM 0.6.x):
`Scheduler.schedule()` (vllm/core/scheduler.py) and the output processing that
`LLMEngine._process_model_outputs` runs per step (vllm/engine/llm_engine.py): per
sequence group `SingleStepOutputProcessor.process_outputs` (append the sampled token,
incremental detokenisation, stop checks), `Scheduler.free_finished_seq_groups`, and
`RequestOutputFactory.create` per group (the outputs the API side streams).

Conditions as in vllm_v1_scheduler.py: `running` sequences decoding, each step pure decode
or with one new prompt of P tokens admitted. V0 without chunked prefill (its default
below 32k context) runs that prompt as a prefill-only step: the running sequences wait
one step (`_schedule_default`: "Don't schedule decodes if prefills are scheduled"); the
prefill step is timed on its own. Input preparation (`ModelRunner.prepare_model_input`)
builds GPU tensors and is not measured here.

    pip install vllm==0.6.3.post1
    python calibration/host/vllm_v0_scheduler.py --out vllm_v0_scheduler.csv
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from _common import Clock, Rows, add, byte_bpe_tokenizer, cpu_name, settle  # noqa: E402

BLOCK = 16


def tokenizer_group():
    from transformers import PreTrainedTokenizerFast
    from vllm.transformers_utils.tokenizer_group import TokenizerGroup

    tok, desc = byte_bpe_tokenizer()
    d = tempfile.mkdtemp(prefix="hostloop-tok-")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=None).save_pretrained(d)
    return TokenizerGroup(tokenizer_id=d, enable_lora=False, max_num_seqs=1024, max_input_length=None), desc


class Engine:
    """The parts of LLMEngine's step that run on the CPU, built from the engine's classes."""

    def __init__(self, max_seqs: int, budget: int, num_blocks: int, max_len: int):
        from vllm.config import CacheConfig, SchedulerConfig
        from vllm.core.scheduler import Scheduler
        from vllm.engine.output_processor.single_step import SingleStepOutputProcessor
        from vllm.engine.output_processor.stop_checker import StopChecker
        from vllm.transformers_utils.detokenizer import Detokenizer
        from vllm.utils import Counter

        self.sc = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_len)
        cc = CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9, swap_space=0, cache_dtype="auto")
        cc.num_gpu_blocks, cc.num_cpu_blocks = num_blocks, 0
        self.scheduler = Scheduler(self.sc, cc, None, 1, None)
        self.tg, self.tok_desc = tokenizer_group()
        self.detok = Detokenizer(self.tg)
        stop = StopChecker(max_len, lambda seq: self.tg.get_lora_tokenizer(seq.lora_request))
        self.proc = SingleStepOutputProcessor(self.sc, self.detok, [self.scheduler], Counter(), stop)
        self.n = 0

    def add(self, prompt_len: int, max_tokens: int = 10**6):
        from vllm.sampling_params import SamplingParams
        from vllm.sequence import Sequence, SequenceGroup

        try:
            from vllm.inputs import token_inputs

            inputs = token_inputs(prompt_token_ids=None)
        except ImportError:
            inputs = None
        self.n += 1
        base = (self.n * 7919) % 120000
        ids = [(base + k) % 128000 for k in range(prompt_len)]
        if inputs is not None:
            inputs = token_inputs(prompt_token_ids=ids)
        else:
            inputs = {"prompt_token_ids": ids}
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        seq = Sequence(self.n, inputs, BLOCK, eos_token_id=None)
        group = SequenceGroup(f"r{self.n}", [seq], arrival_time=time.time(), sampling_params=sp)
        self.scheduler.add_seq_group(group)
        return group

    def step(self, token: int):
        """schedule, then the output processing of the scheduled groups; returns
        (scheduler outputs, schedule sample, output-processing sample)."""
        from vllm.outputs import RequestOutputFactory
        from vllm.sequence import CompletionSequenceGroupOutput, Logprob, SequenceOutput

        with Clock() as c1:
            metas, so, _ = self.scheduler.schedule()
        with Clock() as c2:
            for sg in so.scheduled_seq_groups:
                group = sg.seq_group
                seq = group.seqs[0]
                out = CompletionSequenceGroupOutput(
                    samples=[SequenceOutput(seq.seq_id, token, {token: Logprob(0.0)})], prompt_logprobs=None
                )
                group.update_num_computed_tokens(sg.token_chunk_size)
                self.proc.process_outputs(group, [out], False)
            self.scheduler.free_finished_seq_groups()
            for sg in so.scheduled_seq_groups:
                RequestOutputFactory.create(sg.seq_group)
        return so, c1.sample, c2.sample


def run(args, rows: Rows):
    max_running = max(args.running)
    max_len = args.prompt + args.steps * args.reps * 3 + 4096
    blocks = (max_running + 2) * (max_len // BLOCK + 1)
    budget = max(args.budget, max(args.prefill, default=0), max_running)
    eng = Engine(max_running + 1, budget, blocks, max_len)
    print(f"tokenizer: {eng.tok_desc}", file=sys.stderr)
    token = 1000
    for running in sorted(args.running):
        while eng.scheduler.get_num_unfinished_seq_groups() < running:
            eng.add(args.prompt)
        while any(g.is_prefill() for g in list(eng.scheduler.running) + list(eng.scheduler.waiting)):
            eng.step(token)
        for _ in range(3):
            eng.step(token)
        for rep in range(args.reps):
            settle()
            ts, tp = [], []
            for _ in range(args.steps):
                so, a, b = eng.step(token)
                assert so.num_prefill_groups == 0 and len(so.scheduled_seq_groups) == running
                ts.append(a)
                tp.append(b)
            rows.add("schedule", running, running, rep, ts)
            rows.add("process_outputs", running, running, rep, tp)
            rows.add("schedule+process", running, running, rep, [add(a, b) for a, b in zip(ts, tp)])
        for p in args.prefill:
            for rep in range(args.reps):
                settle()
                ts = []
                for _ in range(max(1, args.steps // 4)):
                    eng.add(p, max_tokens=1)  # finishes at its first token: running stays as it was
                    so, a, b = eng.step(token)
                    assert so.num_prefill_groups == 1 and len(so.scheduled_seq_groups) == 1, "prefill step"
                    ts.append(add(a, b))
                rows.add("prefill_step(schedule+process)", running, p, rep, ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--running", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128, 512, 1024]
    )
    ap.add_argument("--prefill", type=lambda s: [int(x) for x in s.split(",") if x], default=[512, 2048])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="vllm_v0_scheduler.csv")
    args = ap.parse_args()
    import vllm

    print(f"vLLM {vllm.__version__} on {cpu_name()}", file=sys.stderr)
    rows = Rows("vllm-v0", vllm.__version__)
    run(args, rows)
    rows.write(args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time vLLM V1's output path on this CPU, per decode step of `running` requests that each
stream one token (no GPU):

- `outputs_serialize`: the engine core encodes the step's `EngineCoreOutputs` with
  `MsgpackEncoder` (its output thread) and the API server decodes them with
  `MsgpackDecoder` (vllm/v1/serial_utils.py); the ZMQ hop itself is not in it.
- `output_processor`: `OutputProcessor.process_outputs` in the API server process
  (vllm/v1/engine/output_processor.py): incremental detokenisation of each new token
  (`IncrementalDetokenizer`, the tokenizers library's `DecodeStream` for a fast
  tokenizer), stop checks, a delta `RequestOutput` per request put on its collector.
- `openai_chunk`: per request, taking the output off its collector and formatting the
  OpenAI streaming chunk as the chat endpoint does (`ChatCompletionStreamResponse`,
  `model_dump_json`); HTTP and the asyncio loop are not in it (a lower bound).

The tokenizer is a ~130k byte-level BPE built offline (see _common.byte_bpe_tokenizer);
the streamed tokens are the encoding of an English + code + mixed-script text.

    pip install vllm==0.10.1.1
    python calibration/host/vllm_v1_frontend.py --out vllm_v1_frontend.csv
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from _common import SAMPLE_TEXT, Clock, Rows, byte_bpe_tokenizer, cpu_name, settle, timed  # noqa: E402


def hf_tokenizer_dir():
    from transformers import PreTrainedTokenizerFast

    tok, desc = byte_bpe_tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    d = tempfile.mkdtemp(prefix="hostloop-tok-")
    fast.save_pretrained(d)
    return d, desc


def make_output_processor(tok_dir: str):
    from vllm.v1.engine.output_processor import OutputProcessor

    params = inspect.signature(OutputProcessor.__init__).parameters
    try:
        from vllm.transformers_utils.tokenizer_group import TokenizerGroup

        tokenizer = TokenizerGroup(
            tokenizer_id=tok_dir, enable_lora=False, max_num_seqs=1024, max_input_length=None
        )
    except ImportError:
        from vllm.transformers_utils.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(tok_dir)
    kw = {"log_stats": True}
    kw["tokenizer" if "tokenizer" in params else list(params)[1]] = tokenizer
    return OutputProcessor(**kw)


def make_core_request(i: int, prompt_ids: list[int]):
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    sp = SamplingParams(max_tokens=10**6, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    fields = EngineCoreRequest.__struct_fields__
    kw = {}
    for f in fields:
        kw[f] = None
    kw.update(request_id=f"r{i}", prompt_token_ids=prompt_ids, sampling_params=sp, eos_token_id=None)
    for f, v in (("arrival_time", time.time()), ("client_index", 0), ("current_wave", 0), ("priority", 0)):
        if f in fields:
            kw[f] = v
    defaults = getattr(EngineCoreRequest, "__struct_defaults__", ())
    required = fields[: len(fields) - len(defaults)]
    return EngineCoreRequest(**{k: v for k, v in kw.items() if k in required or v is not None})


def stream_chunks(rids, queues, created):
    """What the chat endpoint does per streamed delta: take it off the request's collector and
    format one server-sent event."""
    from vllm.entrypoints.openai.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
        DeltaMessage,
    )

    for r in rids:
        out = queues[r][0].get_nowait()
        delta = out.outputs[0]
        chunk = ChatCompletionStreamResponse(
            id=f"chatcmpl-{r}",
            object="chat.completion.chunk",
            created=created,
            model="model",
            choices=[
                ChatCompletionResponseStreamChoice(
                    index=0, delta=DeltaMessage(content=delta.text), logprobs=None, finish_reason=None
                )
            ],
        )
        _ = f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"


def run(args, rows: Rows):
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.engine.output_processor import RequestOutputCollector
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    tok_dir, desc = hf_tokenizer_dir()
    print(f"tokenizer: {desc}", file=sys.stderr)
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tok_dir)(SAMPLE_TEXT * 4, add_special_tokens=False)["input_ids"]
    enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
    created = int(time.time())
    n_req = 0
    for running in args.running:
        op = make_output_processor(tok_dir)
        queues = {}
        for _ in range(running):
            n_req += 1
            req = make_core_request(n_req, ids[:16])
            q = RequestOutputCollector(output_kind=req.sampling_params.output_kind)
            op.add_request(req, None, None, 0, q)
            queues[req.request_id] = (q, n_req)
        rids = list(queues)
        pos = 16
        for rep in range(-1, args.reps):  # rep -1 is a warm-up
            settle()
            t_ser, t_op, t_chunk = [], [], []
            for _ in range(args.steps):
                outs = [
                    EngineCoreOutput(request_id=r, new_token_ids=[ids[(pos + 13 * k) % len(ids)]])
                    for k, r in enumerate(rids)
                ]
                pos += 1
                with Clock() as c:
                    frames = enc.encode(EngineCoreOutputs(outputs=outs))
                    got = dec.decode(frames)
                t_ser.append(c.sample)
                _, t = timed(op.process_outputs, got.outputs, time.monotonic(), IterationStats())
                t_op.append(t)
                _, t = timed(stream_chunks, rids, queues, created)
                t_chunk.append(t)
            if rep < 0:
                continue
            rows.add("outputs_serialize", running, running, rep, t_ser)
            rows.add("output_processor", running, running, rep, t_op)
            rows.add("openai_chunk", running, running, rep, t_chunk)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--running", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128, 512, 1024]
    )
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="vllm_v1_frontend.csv")
    args = ap.parse_args()
    import vllm

    print(f"vLLM {vllm.__version__} on {cpu_name()}", file=sys.stderr)
    rows = Rows("vllm-v1", vllm.__version__)
    run(args, rows)
    rows.write(args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Measure an engine front end's CPU cost per request and per output token on this CPU.

Stands for SGLang's TokenizerManager -> Scheduler -> DetokenizerManager path (and vLLM's
API server -> EngineCore): tokenize the prompt with a tiktoken-style BPE of ~130k tokens
(the Tekken tokenizer shipped in the mistral-common wheel; Kimi K2's tokenizer is also
tiktoken BPE), pickle a tokenized request and move it over a ZMQ ipc PUSH/PULL pair,
unpickle it; on the way out, detokenize one token incrementally and pickle/send one
output message per step. Prints medians in microseconds as JSON.

    pip install mistral-common pyzmq && python calibration/measure_frontend.py

Results of the shipped profiles: docs/engines.md section 1.
"""

import json
import os
import pickle
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

import mistral_common
import zmq
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

DATA = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")
PROMPT = (
    "You are a senior Python engineer. Explain, step by step, how the following function works, "
    "point out any bugs, and rewrite it to be faster and more readable. Keep the explanation short "
    "and give the final code in one block.\n\n"
    "def merge_intervals(intervals):\n    intervals.sort(key=lambda x: x[0])\n    out = []\n"
    "    for s, e in intervals:\n        if out and s <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], e)\n"
    "        else:\n            out.append([s, e])\n    return out\n\n"
    "Also describe its time and space complexity, and give three test cases with edge conditions, "
    "including empty input, touching intervals and nested intervals. "
) * 2


@dataclass
class SamplingParams:  # the fields a serving request carries
    max_new_tokens: int = 300
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True


@dataclass
class TokenizedReq:  # shaped like SGLang's TokenizedGenerateReqInput
    rid: str
    input_text: str
    input_ids: list
    sampling_params: SamplingParams
    return_logprob: bool = False
    stream: bool = True
    lora_path: str | None = None


@dataclass
class OutBatch:  # shaped like a per-step output message (BatchTokenIDOut / EngineCoreOutputs)
    rids: list
    finished_reasons: list
    decoded_texts: list
    output_ids: list
    prompt_tokens: list
    completion_tokens: list


def median_us(fn, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main():
    tok = Tekkenizer.from_file(DATA)
    ids = tok.encode(PROMPT, bos=True, eos=False)
    n_tok = len(ids)
    tokenize_us = median_us(lambda: tok.encode(PROMPT, bos=True, eos=False), 300)

    ctx = zmq.Context()
    path = "ipc://" + os.path.join(tempfile.mkdtemp(), "fe")
    pull = ctx.socket(zmq.PULL)
    pull.bind(path)
    push = ctx.socket(zmq.PUSH)
    push.connect(path)
    req = TokenizedReq("a" * 32, PROMPT, ids, SamplingParams())

    def ipc_one():
        push.send_pyobj(req)
        pull.recv_pyobj()

    for _ in range(50):
        ipc_one()
    ipc_us = median_us(ipc_one, 1000)
    pickle_bytes = len(pickle.dumps(req))

    # way out: per step, one output message for a batch of B running requests, incremental detokenize
    def out_step(b):
        texts = [tok.decode(ids[i % n_tok : i % n_tok + 1]) for i in range(b)]
        msg = OutBatch(
            ["a" * 32] * b, [None] * b, texts, [[ids[i % n_tok]] for i in range(b)], [n_tok] * b, [1] * b
        )
        push.send_pyobj(msg)
        pull.recv_pyobj()

    out = {b: median_us(lambda b=b: out_step(b), 300) for b in (1, 8, 64)}
    per_token_us = (out[64] - out[1]) / 63
    per_step_us = out[1] - per_token_us

    # a pickled Python object between two processes' CPU groups (gloo's send of size + payload over TCP)
    a, b = socket.socketpair()

    def relay(obj):
        data = pickle.dumps(obj)
        a.sendall(len(data).to_bytes(8, "little"))
        a.sendall(data)
        nb = int.from_bytes(b.recv(8), "little")
        buf = b""
        while len(buf) < nb:
            buf += b.recv(nb - len(buf))
        pickle.loads(buf)

    relay_empty_us = median_us(lambda: relay([]), 2000)
    relay_req_us = median_us(lambda: relay([req]), 2000)

    print(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "cpu": os.cpu_count(),
                "prompt_tokens": n_tok,
                "tokenize_us": round(tokenize_us, 1),
                "request_pickle_bytes": pickle_bytes,
                "request_ipc_us": round(ipc_us, 1),
                "frontend_per_request_us": round(tokenize_us + ipc_us, 1),
                "out_step_us": {k: round(v, 1) for k, v in out.items()},
                "out_per_token_us": round(per_token_us, 2),
                "out_per_step_us": round(per_step_us, 1),
                "relay_empty_us": round(relay_empty_us, 1),
                "relay_one_request_us": round(relay_req_us, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

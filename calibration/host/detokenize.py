#!/usr/bin/env python3
"""Time incremental detokenisation per streamed token with the Hugging Face `tokenizers`
library, the two ways the engines call it (no engine needed):

- `decode_stream_step`: one `tokenizers.decoders.DecodeStream.step` per request per step,
  what vLLM V1's `FastIncrementalDetokenizer` does for a fast tokenizer
  (vllm/v1/engine/detokenizer.py).
- `decode_batch_windows`: per step, two `Tokenizer.decode_batch` calls over every
  request's last few tokens (a window from the last surrounding offset, and the same
  plus the new token), then a string difference: the shape of SGLang's
  `DetokenizerManager` (python/sglang/srt/managers/detokenizer_manager.py), whose
  window starts 5 tokens back (`INIT_INCREMENTAL_DETOKENIZATION_OFFSET`).

`running` requests each stream one token per step; the tokens are the encoding of an
English + code + mixed-script text. The tokenizer is a ~130k-token byte-level BPE built
offline from the Tekken vocabulary of the mistral-common wheel, or any tokenizer.json
given with --tokenizer-json.

    pip install tokenizers transformers mistral-common
    python calibration/host/detokenize.py --out detokenize.csv
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# batch decoding in the tokenizers library fans out over threads, which the calling
# thread's CPU clock does not see: time it on one thread (the CPU work it costs)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from _common import SAMPLE_TEXT, Clock, Rows, cpu_name, settle  # noqa: E402

WINDOW = 5


def load(path: str | None):
    if path:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(path), f"tokenizer.json {os.path.basename(path)}"
    from _common import byte_bpe_tokenizer

    return byte_bpe_tokenizer()


def run(args, rows: Rows, tok):
    from tokenizers.decoders import DecodeStream

    ids = tok.encode(SAMPLE_TEXT * 4, add_special_tokens=False).ids
    for running in args.running:
        streams = [DecodeStream(skip_special_tokens=True) for _ in range(running)]
        offs = [(13 * k) % len(ids) for k in range(running)]
        hist = [[ids[(o - j) % len(ids)] for j in range(WINDOW, 0, -1)] for o in offs]
        for s, o in zip(streams, offs):  # prime each stream with a few prompt tokens
            for j in range(WINDOW):
                s.step(tok, ids[(o + j) % len(ids)])
        pos = WINDOW
        for rep in range(-1, args.reps):
            settle()
            a_s, b_s = [], []
            for _ in range(args.steps):
                new = [ids[(o + pos) % len(ids)] for o in offs]
                pos += 1
                with Clock() as c:
                    for s, t in zip(streams, new):
                        s.step(tok, t)
                a_s.append(c.sample)
                with Clock() as c:
                    surr = tok.decode_batch([h[-WINDOW:] for h in hist], skip_special_tokens=True)
                    for h, t in zip(hist, new):
                        h.append(t)
                    full = tok.decode_batch([h[-WINDOW - 1 :] for h in hist], skip_special_tokens=True)
                    _ = [f[len(s) :] if not f.endswith("\ufffd") else "" for s, f in zip(surr, full)]
                b_s.append(c.sample)
                for h in hist:
                    del h[: -WINDOW - 1]
            if rep < 0:
                continue
            rows.add("decode_stream_step", running, running, rep, a_s)
            rows.add("decode_batch_windows", running, running, rep, b_s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--running", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128, 512, 1024]
    )
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokenizer-json", default=None)
    ap.add_argument("--out", default="detokenize.csv")
    args = ap.parse_args()
    import tokenizers

    tok, desc = load(args.tokenizer_json)
    print(f"tokenizers {tokenizers.__version__}, {desc}, on {cpu_name()}", file=sys.stderr)
    rows = Rows("tokenizers", tokenizers.__version__)
    run(args, rows, tok)
    rows.write(args.out)


if __name__ == "__main__":
    main()

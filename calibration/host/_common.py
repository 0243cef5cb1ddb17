"""Shared code of the host-loop measurements: timing, CSV rows, the CPU's name, a
Llama-3.1-8B-shaped model config, and an offline byte-level BPE tokenizer.

Nothing here measures by itself; every script in this folder imports it.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time

# The model the schedulers are configured for: Llama-3.1-8B's public config.json (the
# scheduler reads only its length and vocabulary limits, never its weights).
LLAMA_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

FIELDS = [
    "engine",
    "version",
    "component",
    "running",
    "step_tokens",
    "rep",
    "n",
    "cpu_median_us",
    "cpu_p10_us",
    "cpu_p90_us",
    "wall_median_us",
]


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo (lscpu) reports it, else platform's guess."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_dir() -> str:
    """A temporary directory holding only the config.json above."""
    d = tempfile.mkdtemp(prefix="hostloop-model-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(LLAMA_8B_CONFIG, f)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 128000, "eos_token_id": 128001}, f)
    return d


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """median, 10th and 90th percentile."""
    xs = sorted(xs)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return statistics.median(xs), q[0], q[-1]


class Rows:
    """CSV rows: one per repetition of one measured condition. A repetition is a block of
    consecutive timed calls; a row gives the median, 10th and 90th percentile of the calls'
    CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID: time the thread ran, so other
    processes on a shared machine do not inflate it) and the median wall time, microseconds."""

    def __init__(self, engine: str, version: str):
        self.engine, self.version, self.rows = engine, version, []

    def add(self, component: str, running: int, step_tokens: int, rep: int, samples: list[tuple[int, int]]):
        """samples: (wall ns, cpu ns) per call."""
        med, p10, p90 = quantiles([c / 1e3 for _, c in samples])
        wall = quantiles([w / 1e3 for w, _ in samples])[0]
        self.rows.append(
            {
                "engine": self.engine,
                "version": self.version,
                "component": component,
                "running": running,
                "step_tokens": step_tokens,
                "rep": rep,
                "n": len(samples),
                "cpu_median_us": round(med, 2),
                "cpu_p10_us": round(p10, 2),
                "cpu_p90_us": round(p90, 2),
                "wall_median_us": round(wall, 2),
            }
        )
        print(
            f"{component:<30} running {running:>5} step_tokens {step_tokens:>6} rep {rep}: "
            f"cpu median {med:9.1f} us (p10 {p10:.1f}, p90 {p90:.1f}; wall {wall:.1f}; n {len(samples)})",
            file=sys.stderr,
            flush=True,
        )

    def write(self, path: str):
        new = not os.path.exists(path)
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                w.writeheader()
            w.writerows(self.rows)
        self.rows = []


class Clock:
    """Wall and thread-CPU time of a stretch of code: `with Clock() as c: ...; c.sample`."""

    def __enter__(self):
        self.w0, self.c0 = time.perf_counter_ns(), time.thread_time_ns()
        return self

    def __exit__(self, *exc):
        self.sample = (time.perf_counter_ns() - self.w0, time.thread_time_ns() - self.c0)
        return False


def timed(fn, *args, **kwargs):
    """(result, (wall ns, cpu ns)) of one call."""
    with Clock() as c:
        out = fn(*args, **kwargs)
    return out, c.sample


def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], a[1] + b[1]


def settle():
    """Collect garbage between conditions, so one condition's garbage is not timed in the next."""
    gc.collect()


def byte_bpe_tokenizer():
    """A Hugging Face `tokenizers.Tokenizer` of ~130k byte-level BPE tokens built offline from
    the Tekken vocabulary shipped in the mistral-common wheel (a tiktoken-style vocabulary,
    as Llama 3, Qwen 2/3, DeepSeek and Kimi use), through transformers' TikTokenConverter.
    Returns (tokenizer, description)."""
    import mistral_common
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")
    with open(path) as f:
        tek = json.load(f)
    n = tek["config"]["default_vocab_size"] - tek["config"]["default_num_special_tokens"]
    tmp = tempfile.NamedTemporaryFile("w", suffix=".tiktoken", delete=False)
    with tmp:
        for i, entry in enumerate(tek["vocab"][:n]):
            tmp.write(f"{entry['token_bytes']} {i}\n")
    # TikTokenConverter reads "base64 rank" lines (the tiktoken format, as Tekken stores them)
    kw = {"vocab_file": tmp.name, "pattern": tek["config"]["pattern"]}
    try:  # transformers 4.x wants the special tokens as a list
        conv = TikTokenConverter(additional_special_tokens=[], **kw)
    except TypeError:
        conv = TikTokenConverter(**kw)
    tok = conv.converted()
    os.unlink(tmp.name)
    return tok, f"byte-level BPE, {n} tokens (mistral-common {mistral_common.__version__} tekken_240911)"


SAMPLE_TEXT = (
    "The scheduler keeps a queue of waiting requests and a list of running ones. At every step it "
    "gives each running request one token of budget, then admits waiting requests while their "
    "prompts fit the remaining token budget and the free KV-cache blocks. def merge(a, b):\n"
    "    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
    "            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n"
    "    return out + a[i:] + b[j:]\n"
    "Numbers such as 3.14159, 2048 and 1e-5 and words in other scripts (déjà vu, 東京, Москва) "
    "make the detokenizer hold partial characters back until they are complete. "
)

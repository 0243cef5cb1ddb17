"""Hostile input: values a careless or malicious user gives, each refused before any
work with one line and exit code 2 (docs/bad-input.md, "Hostile input").

`hostile_files(folder)` writes the broken files; `CASES` holds (argv, a fragment the
one error line must contain). Every fragment is listed in docs/bad-input.md."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from pipesim.cli import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "bad-input.md"
FAST = ["--model", "llama-3.1-8b", "--output-len", "8", "--input-len", "16"]
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 4096,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}
MOE = {
    **TINY,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
}
HEADER = "arrival_s,input_tokens,output_tokens\n"

# HF config variants: name -> the config's JSON text
CONFIGS: dict[str, str] = {}
SIZES = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
for _key in SIZES:
    for _tag, _value in (
        ("inf", "Infinity"),
        ("nan", "NaN"),
        ("zero", "0"),
        ("str", '"12"'),
        ("huge", "1e30"),
    ):
        CONFIGS[f"{_key}-{_tag}"] = json.dumps({**TINY, _key: 7}).replace(
            f'"{_key}": 7', f'"{_key}": {_value}'
        )
CONFIGS.update(
    {
        "neginf": json.dumps(TINY).replace('"hidden_size": 1024', '"hidden_size": -Infinity'),
        "kv16": json.dumps({**TINY, "num_key_value_heads": 16}),
        "kv3": json.dumps({**TINY, "num_key_value_heads": 3}),
        "textcfg-num": json.dumps({**TINY, "text_config": 5}),
        "textcfg-list": json.dumps({**TINY, "text_config": [1, 2]}),
        "textcfg-nan": json.dumps(
            {"architectures": ["LlamaForCausalLM"], "text_config": {**TINY, "hidden_size": 7}}
        ).replace('"hidden_size": 7', '"hidden_size": NaN'),
        "quant-list": json.dumps({**TINY, "quantization_config": [1, 2]}),
        "quant-str": json.dumps({**TINY, "quantization_config": "fp8"}),
        "quant-groups": json.dumps(
            {**TINY, "quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1]}}
        ),
        "quant-bits": json.dumps(
            {
                **TINY,
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "config_groups": {"g": {"weights": {"num_bits": "x"}}},
                },
            }
        ),
        "quant-ignore": json.dumps(
            {
                **TINY,
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "ignore": 5,
                    "config_groups": {"g": {"weights": {"num_bits": 4}}},
                },
            }
        ),
        "deep": "[" * 100_000 + "]" * 100_000,
        "deepobj": '{"a":' * 50_000 + "1" + "}" * 50_000,
        "topk-over": json.dumps({**MOE, "num_experts_per_tok": 9}),
        "topk-zero": json.dumps({**MOE, "num_experts_per_tok": 0}),
        "moe-inter-zero": json.dumps({**MOE, "moe_intermediate_size": 0}),
        "arch-mamba": json.dumps({**TINY, "architectures": ["MambaForCausalLM"], "model_type": "mamba"}),
        "arch-bert": json.dumps({**TINY, "architectures": ["BertModel"], "model_type": "bert"}),
        "arch-num": json.dumps({**TINY, "architectures": 5}),
        "float64": json.dumps({**TINY, "torch_dtype": "float64"}),
        "dtype-num": json.dumps({**TINY, "torch_dtype": 16}),
        "layers-huge": json.dumps({**TINY, "num_hidden_layers": 10**7}),
        "heads-bool": json.dumps({**TINY, "num_attention_heads": True}),
        "cfg-null": "null",
        "cfg-str": '"llama"',
    }
)


def hostile_files(t: Path) -> Path:
    """Write every broken file of the cases into folder `t`."""
    from pipesim.profiles.profile import _profile_dir

    for name, text in CONFIGS.items():
        (t / f"cfg-{name}.json").write_text(text)
    (t / "cfg-binary.json").write_bytes(bytes(range(256)) * 4)
    (t / "tiny.json").write_text(json.dumps(TINY))
    (t / "short-ctx.json").write_text(json.dumps({**TINY, "max_position_embeddings": 64}))
    traces = {
        "inf-arrival": "0,10,10\ninf,10,10\n",
        "nan-tokens": "0,nan,10\n",
        "inf-tokens": "0,10,inf\n",
        "frac-tokens": "0,10.5,10\n",
        "huge-tokens": "0,1e30,10\n",
        "text-arrival": "soon,10,10\n",
        "past-horizon": "5e6,10,10\n",
        "all-past": "1e300,10,10\n2e300,10,10\n",
        "neg-output": "0,10,-3\n",
        "bool": "0,True,10\n",
        "blank-cell": "0,,10\n",
        "ninf-arrival": "-inf,10,10\n",
    }
    for name, rows in traces.items():
        (t / f"trace-{name}.csv").write_text(HEADER + rows)
    (t / "trace-header.csv").write_text(HEADER)
    (t / "trace-empty.csv").write_text("")
    (t / "trace-binary.csv").write_bytes(b"\x00\xff\xfe" * 300)
    (t / "trace-long.csv").write_text(HEADER + "0,10,10\n" * 1_000_001)
    (t / "trace-work.csv").write_text(HEADER + "0,10,20000\n" * 2000)
    (t / "trace-unsorted.csv").write_text(HEADER + "5,16,8\n0,16,8\n")
    (t / "trace-ok.csv").write_text(HEADER + "0,16,8\n0.1,16,8\n")

    src = Path(str(_profile_dir("rtx-pro-6000-sglang-healthy")))
    toml = (src / "profile.toml").read_text()

    def profile(name, old=None, new=None, table=None, text=None, raw=None, top=None):
        d = t / name
        shutil.copytree(src, d)
        if old is not None or top is not None:
            assert old is None or old in toml, old
            body = toml.replace(old, new, 1) if old is not None else toml
            (d / "profile.toml").write_text(body if top is None else f"{top}\n{body}")
        if raw is not None:
            (d / "profile.toml").write_bytes(raw)
        if table is not None:
            with gzip.open(d / f"{table}.csv.gz", "wt") as fh:
                fh.write(text)

    profile("p-inf-param", '"cpu_iteration_ms" = 0', '"cpu_iteration_ms" = inf #')
    profile("p-nan-param", '"cpu_iteration_ms" = 0', '"cpu_iteration_ms" = nan #')
    profile("p-params-num", "[params]", "[params_moved]", top="params = 5")
    profile("p-name-num", 'name = "rtx-pro-6000-sglang-healthy"', "name = 5")
    profile("p-engine-list", 'engine = "sglang"', 'engine = ["sglang"]')
    profile("p-box-num", 'box = "rtx-pro-6000-server-8x"', "box = 8")
    profile("p-version-num", 'engine_version = "', 'engine_version = 5\nx = "')
    profile("p-deploy-str", top='deployment = "fast"')
    profile("p-deploy-knob", top='deployment = { max_running_requests = "many" }')
    profile("p-deploy-float", top="deployment = { max_running_requests = 2.5 }")
    profile("p-sources-num", "[sources]", "[sources_moved]", top="sources = 5")
    profile("p-binary", raw=b"\xff\xfe\x00name = 1")
    profile(
        "t-inf-lat", table="collectives", text="op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,inf\n"
    )
    profile(
        "t-inf-size", table="collectives", text="op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,inf,0.02\n"
    )
    profile(
        "t-ninf-lat", table="collectives", text="op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,-inf\n"
    )
    profile(
        "t-frac-gpus",
        table="collectives",
        text="op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,2.5,256,0.02\n",
    )
    profile(
        "t-text-lat", table="collectives", text="op,impl,gpus,nbytes,latency_ms\nall_reduce,nccl,8,256,fast\n"
    )
    profile("t-empty", table="collectives", text="op,impl,gpus,nbytes,latency_ms\n")
    profile("t-binary", table="collectives", text="\x00\x01\x02" * 50)

    gpu = '[gpu]\nname = "g"\ncount = 2\nmemory_bytes = MEM\nmem_bw_bytes_s = 1e12\nflops_bf16 = 1e14\n'
    links = (
        '[topology]\nlinks = [{ child = "gpu0", parent = "a", bw_gb_s = 1, latency_us = LAT },'
        ' { child = "gpu1", parent = "a", bw_gb_s = 1, latency_us = 1 }]\n'
    )
    boxes = {
        "nan-lat": gpu.replace("MEM", "1e10") + links.replace("LAT", "nan"),
        "inf-mem": gpu.replace("MEM", "inf") + links.replace("LAT", "1"),
        "str-mem": gpu.replace("MEM", '"big"') + links.replace("LAT", "1"),
        "no-gpu": links.replace("LAT", "1"),
        "links-str": gpu.replace("MEM", "1e10") + '[topology]\nlinks = "all"\n',
        "count-huge": gpu.replace("MEM", "1e10").replace("count = 2", "count = 100000000000")
        + links.replace("LAT", "1"),
    }
    for name, text in boxes.items():
        (t / f"box-{name}.toml").write_text(text)
    (t / "box-binary.toml").write_bytes(b"\xff\xfe\x00\x01")
    (t / "box-deep.toml").write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")

    sweep_cols = (
        "box,gpu,model,profile,engine,input_len,output_len,seed,gpus,tp,pp,conc,split,"
        "output_throughput_tok_s,output_tok_s_per_gpu,per_request_tok_s,ttft_ms_p99,tpot_ms_p50,"
        "compute_share,allreduce_share,bubble_fraction,idle_p2p_share,idle_cpu_share,idle_bubble_share,"
        "p2p_share,cpu_share\n"
    )
    row = "b,g,m,p,sglang,16,8,0,8,8,1,1,TP8 x PP1,{thr},{thr},50,20,10,0.5,0.1,0.1,0.1,0.1,0.1,0.1,0.1\n"
    (t / "sw-text.csv").write_text(sweep_cols + row.format(thr="fast"))
    (t / "sw-nan.csv").write_text(sweep_cols + row.format(thr="nan"))
    (t / "sw-inf.csv").write_text(sweep_cols + row.format(thr="inf"))
    (t / "sw-empty.csv").write_text(sweep_cols)
    (t / "sw-ok.csv").write_text(sweep_cols + row.format(thr="100"))
    (t / "sw-conc-text.csv").write_text(
        sweep_cols + row.format(thr="100").replace(",8,1,1,TP8", ",8,1,x,TP8")
    )
    (t / "sw-binary.csv").write_bytes(b"\x00\xff" * 100)
    (t / "sw-nocols.csv").write_text("a,b\n1,2\n")
    (t / "sw-parquet.parquet").write_text("not parquet")
    _resume_files(t)

    bench = {"max_concurrency": 4, "output_throughput": 100.0, "completed": 10}
    (t / "bench-inf.json").write_text(
        json.dumps({**bench, "output_throughput": 7}).replace(": 7", ": Infinity")
    )
    (t / "bench-nan.json").write_text(json.dumps({**bench, "output_throughput": 7}).replace(": 7", ": NaN"))
    (t / "bench-str.json").write_text(json.dumps({**bench, "output_throughput": "100"}))
    (t / "bench-conc-str.json").write_text(json.dumps({**bench, "max_concurrency": "4"}))
    (t / "bench-conc-huge.json").write_text(json.dumps({**bench, "max_concurrency": 1e308}))
    (t / "bench-conc-frac.json").write_text(json.dumps({**bench, "max_concurrency": 2.5}))
    (t / "bench-list.json").write_text("[1, 2]")
    (t / "bench-binary.json").write_bytes(bytes(range(256)))
    (t / "bench-deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (t / "notaprofile.txt").write_text("keep me")
    (t / "plainfolder").mkdir()
    (t / "plainfolder" / "mine.txt").write_text("keep me")
    shutil.copytree(src, t / "target")
    return t


def _resume_files(t: Path) -> None:
    """Part files of an interrupted `sweep --conc 1` (FAST): a scenario twice, rows of
    another seed, binary bytes, text in a number column."""
    import csv
    import io

    from pipesim.explore.stream import options_text

    mine = options_text({"model": "llama-3.1-8b"}, {}, False)
    other = options_text({"model": "llama-3.1-8b", "seed": 5}, {}, False)
    cols = ["box", "engine", "input_len", "output_len", "gpus", "tp", "pp", "conc", "rate_rps"]
    cols += ["output_throughput_tok_s", "per_request_tok_s", "sweep_options"]
    row = ["rtx-pro-6000-server-8x", "sglang", "16", "8", 8, 8, 1, 1, 0.0, 100.0, 50.0]

    def part(name: str, *rows: list) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([cols, *rows])
        (t / f"{name}.csv.part").write_text(buf.getvalue())

    part("rs-dup", row + [mine], row + [mine])
    part("rs-seed", row + [other])
    part("rs-text", row[:7] + ["one"] + row[8:] + [mine])
    (t / "rs-binary.csv.part").write_bytes(b"\x00\xff" * 50 + b"\n")


D = "{t}"
P = "rtx-pro-6000-sglang-healthy"
CASES: list[tuple[list[str], str]] = []
# --- HF configs: every size field x non-finite, zero, text and absurd values
for _key in SIZES:
    for _tag, _msg in (
        ("inf", f"'{_key}' = inf must be a finite"),
        ("nan", f"'{_key}' = nan must be a finite"),
        ("zero", f"'{_key}' = 0 must be a whole number >= 1"),
        ("str", f"'{_key}' = '12' must be a whole number"),
        ("huge", f"'{_key}' = 1e+30 is above"),
    ):
        CASES.append((["predict", "--conc", "1", "--model", f"{D}/cfg-{_key}-{_tag}.json"], _msg))
CASES += [
    (["predict", "--conc", "1", "--model", f"{D}/cfg-neginf.json"], "'hidden_size' = -inf must be a finite"),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-kv16.json"],
        "num_key_value_heads = 16 must divide num_attention_heads = 8",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-kv3.json"],
        "num_key_value_heads = 3 must divide num_attention_heads = 8",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-textcfg-num.json"],
        "'text_config' must be a JSON object, got int",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-textcfg-list.json"],
        "'text_config' must be a JSON object, got list",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-textcfg-nan.json"],
        "'hidden_size' = nan must be a finite",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-quant-list.json"],
        "'quantization_config' must be a JSON object, got list",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-quant-str.json"],
        "'quantization_config' must be a JSON object, got str",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-quant-groups.json"],
        "compressed-tensors quantization_config has no config_groups",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-quant-bits.json"],
        "'num_bits' = 'x' must be a whole number",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-quant-ignore.json"],
        "list of unquantized modules must be a list",
    ),
    (["predict", "--conc", "1", "--model", f"{D}/cfg-deep.json"], "nested too deeply"),
    (["predict", "--conc", "1", "--model", f"{D}/cfg-deepobj.json"], "nested too deeply"),
    (["predict", "--conc", "1", "--model", f"{D}/cfg-binary.json"], "is not UTF-8 text"),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-topk-over.json"],
        "num_experts_per_tok = 9 is more than the 8 experts",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-topk-zero.json"],
        "'num_experts_per_tok' = 0 must be a whole number >= 1",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-moe-inter-zero.json"],
        "'moe_intermediate_size' = 0 must be a whole number >= 1",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-arch-mamba.json"],
        "architecture MambaForCausalLM is not modelled",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-arch-bert.json"],
        "architecture BertModel is not modelled",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-arch-num.json"],
        "'architectures' must be a list of names",
    ),
    (["predict", "--conc", "1", "--model", f"{D}/cfg-float64.json"], "torch_dtype 'float64' is not modelled"),
    (["predict", "--conc", "1", "--model", f"{D}/cfg-dtype-num.json"], "torch_dtype 16 is not modelled"),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-layers-huge.json"],
        "'num_hidden_layers' = 10000000 is above",
    ),
    (
        ["predict", "--conc", "1", "--model", f"{D}/cfg-heads-bool.json"],
        "'num_attention_heads' = True must be a whole number",
    ),
    (["predict", "--conc", "1", "--model", f"{D}/cfg-cfg-null.json"], "is not a JSON object"),
    (["predict", "--conc", "1", "--model", f"{D}/cfg-cfg-str.json"], "is not a JSON object"),
    (
        [
            "predict",
            "--conc",
            "1",
            "--model",
            f"{D}/short-ctx.json",
            "--input-len",
            "60",
            "--output-len",
            "8",
        ],
        "needs 68 tokens (input + output), above the model's context of 64",
    ),
    (
        [
            "predict",
            "--conc",
            "1",
            "--model",
            "llama-3.1-8b",
            "--tp",
            "8",
            "--input-len",
            "131000",
            "--output-len",
            "100",
        ],
        "above the model's context of 131072",
    ),
]
# --- traces
CASES += [
    (
        ["predict", "--trace", f"{D}/trace-inf-arrival.csv", *FAST[:2]],
        "column arrival_s: 'inf' is not allowed",
    ),
    (
        ["predict", "--trace", f"{D}/trace-ninf-arrival.csv", *FAST[:2]],
        "column arrival_s: '-inf' is not allowed",
    ),
    (
        ["predict", "--trace", f"{D}/trace-nan-tokens.csv", *FAST[:2]],
        "column input_tokens: 'nan' is not allowed",
    ),
    (
        ["predict", "--trace", f"{D}/trace-inf-tokens.csv", *FAST[:2]],
        "column output_tokens: 'inf' is not allowed",
    ),
    (
        ["predict", "--trace", f"{D}/trace-frac-tokens.csv", *FAST[:2]],
        "column input_tokens: '10.5' is not allowed",
    ),
    (
        ["predict", "--trace", f"{D}/trace-huge-tokens.csv", *FAST[:2]],
        "column input_tokens: '1e30' is not allowed",
    ),
    (
        ["predict", "--trace", f"{D}/trace-text-arrival.csv", *FAST[:2]],
        "column arrival_s: 'soon' is not allowed",
    ),
    (["predict", "--trace", f"{D}/trace-past-horizon.csv", *FAST[:2]], "past the simulated horizon"),
    (["predict", "--trace", f"{D}/trace-all-past.csv", *FAST[:2]], "past the simulated horizon"),
    (
        ["predict", "--trace", f"{D}/trace-neg-output.csv", *FAST[:2]],
        "column output_tokens: '-3' is not allowed",
    ),
    (["predict", "--trace", f"{D}/trace-bool.csv", *FAST[:2]], "column input_tokens: 'True' is not allowed"),
    (
        ["predict", "--trace", f"{D}/trace-blank-cell.csv", *FAST[:2]],
        "column input_tokens: '' is not allowed",
    ),
    (["predict", "--trace", f"{D}/trace-header.csv", *FAST[:2]], "has no requests"),
    (["predict", "--trace", f"{D}/trace-empty.csv", *FAST[:2]], "cannot read as CSV"),
    (["predict", "--trace", f"{D}/trace-binary.csv", *FAST[:2]], "cannot read as CSV"),
    (["predict", "--trace", f"{D}/trace-long.csv", *FAST[:2]], "rows, above the limit of 1,000,000"),
    (["predict", "--trace", f"{D}/trace-work.csv", *FAST[:2]], "above the limit of"),
    (
        ["predict", "--trace", f"{D}/trace-ok.csv", "--num-requests", "5", *FAST[:2]],
        "--num-requests 5 asks for more than the trace's 2 rows",
    ),
    (
        ["predict", "--trace", f"{D}/trace-unsorted.csv", *FAST[:2], "--num-requests", "0"],
        "number of requests must be >= 1",
    ),
    (["predict", "--trace", f"{D}", *FAST[:2]], "is a directory"),
]
# --- command-line numbers: bounds before any work
CASES += [
    (["predict", "--conc", "10000000", *FAST], "concurrency 10000000 is above the limit of 65536"),
    (
        ["predict", "--conc", "1", "--pp", "2", "--pp-async-batch-depth", "1000000000", *FAST],
        "--pp-async-batch-depth 1000000000 is above the limit of 64",
    ),
    (
        ["predict", "--conc", "1", "--num-requests", "5", *FAST],
        "--num-requests counts requests of --rate or --trace",
    ),
    (
        ["predict", "--rate", "1", "--num-requests", "1000000000", *FAST],
        "number of requests must be >= 1 and at most 1000000",
    ),
    (["predict", "--rate", "1e-300", "--num-requests", "1", *FAST], "past the simulated horizon"),
    (["predict", "--rate", "inf", *FAST], "arrival rate must be > 0 requests/s and finite"),
    (["predict", "--rate", "-inf", *FAST], "arrival rate must be > 0 requests/s and finite"),
    (["predict", "--rate", "nan", *FAST], "arrival rate must be > 0 requests/s and finite"),
    (
        [
            "predict",
            "--conc",
            "1",
            "--output-len",
            "120000",
            "--model",
            "llama-3.1-8b",
            "--input-len",
            "16",
            "--tp",
            "8",
        ],
        "above the limit of",
    ),
    (
        ["predict", "--conc", "1", "--nodes", "100000000", *FAST],
        "--nodes 100000000 makes 800000000 GPUs, above the limit of 65536",
    ),
    (
        ["predict", "--conc", "1", "--tp", "100000000000", *FAST],
        "tp 100000000000 is above the limit of 65536",
    ),
    (
        ["predict", "--conc", "1", "--pp", "100000000000", *FAST],
        "pp 100000000000 is above the limit of 65536",
    ),
    (
        ["predict", "--conc", "1", "--max-running-requests", "10000000000", *FAST],
        "--max-running-requests 10000000000 is above the limit of 65536",
    ),
    (
        ["predict", "--conc", "1", "--chunked-prefill-size", "100000000000", *FAST],
        "--chunked-prefill-size 100000000000 is above the limit of",
    ),
    (
        ["predict", "--conc", "1", "--engine", "vllm", "--max-num-batched-tokens", "100000000000", *FAST],
        "--max-num-batched-tokens 100000000000 is above the limit of",
    ),
    (
        ["predict", "--conc", "1", "--engine", "vllm", "--max-num-seqs", "10000000000", *FAST],
        "--max-num-seqs 10000000000 is above the limit of 65536",
    ),
    (
        ["predict", "--conc", "1", "--seed", "100000000000000000000000", *FAST],
        "seed must be a whole number >= 0 and < 2**63",
    ),
    (
        ["predict", "--conc", "1", "--pp", "2", "--layers", "0,32", *FAST],
        "every stage needs at least one layer",
    ),
    (
        ["predict", "--conc", "1", "--pp", "2", "--layers", "-1,33", *FAST],
        "every stage needs at least one layer",
    ),
    (
        ["predict", "--conc", "1", "--pp", "2", "--layers", "16.0,16", *FAST],
        "must be comma-separated whole numbers",
    ),
    (["predict", "--conc", "1", "--input-len", "16.5", *FAST[:2]], "is not a token count"),
    (["predict", "--conc", "1", "--input-len", "inf", *FAST[:2]], "is not a token count"),
    (["predict", "--conc", "1", "--output-len", "1:", *FAST[:2]], "is not a token count"),
    (["predict", "--conc", "1", "--input-len", "1e3", *FAST[:2]], "is not a token count"),
    (["sweep", "--gpus", "100000000000", *FAST], "--gpus: 100000000000 is above the limit of 65536"),
    (["sweep", "--gpus", "16", *FAST], "tp x pp = 16 x 1 = 16 GPUs, but the box has 8"),
    (["sweep", "--conc", "10000000", *FAST], "--conc: 10000000 is above the limit of 65536"),
    (["sweep", "--conc", "1", "--workers", "0", *FAST], "--workers must be a whole number >= 1, got 0"),
    (["sweep", "--conc", "1", "--workers", "-3", *FAST], "--workers must be a whole number >= 1, got -3"),
    (["sweep", "--conc", "1", "--workers", "100000", *FAST], "--workers 100000 is above the limit of 1024"),
    (["sweep", "--conc", "1", "--out", f"{D}/sw.txt", *FAST], "must end in .csv or .parquet"),
    (["sweep", "--conc", "1", "--out", f"{D}/nodir/sw.csv", *FAST], "does not exist"),
    (["sweep", "--conc", "1,", "--gpus", ",", *FAST], "--gpus is empty"),
    (["sweep", "--conc", ",".join(map(str, range(1, 30_001))), *FAST], "above the limit of 100,000"),
    (["sweep", "--conc", "1", "--engine", "sglang,tgi", *FAST], "unknown engine 'tgi'"),
    (["sweep", "--conc", "1", "--box", "nobox,rtx-pro-6000-server-8x", *FAST], "unknown box 'nobox'"),
    (["sweep", "--conc", "1", "--box", "h200-1x,,l4-8x", *FAST], "--box 'h200-1x,,l4-8x' has an empty item"),
    (["sweep", "--conc", "1", *FAST, "--input-len", "64,1e3"], "input length '1e3' is not a token count"),
    (["sweep", "--conc", "1", *FAST, "--output-len", "8,0"], "output length '0': need 1 <= LO <= HI"),
    (["sweep", "--conc", "1", "--resume", *FAST], "--resume continues the sweep in --out: give --out"),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/sw-ok.csv", "--resume", *FAST],
        "has no column sweep_options, so its sweep's options are unknown",
    ),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/rs-dup.csv", *FAST],
        "holds the rows of an interrupted sweep; pass --resume to finish it",
    ),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/rs-dup.csv", "--resume", *FAST],
        "line 3 repeats the scenario of line 2",
    ),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/rs-seed.csv", "--resume", *FAST],
        "was written by a sweep with other options (seed: 5 in the file, default now)",
    ),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/rs-text.csv", "--resume", *FAST],
        "column conc: 'one' is not a number",
    ),
    (
        ["sweep", "--conc", "1", "--out", f"{D}/rs-binary.csv", "--resume", *FAST],
        "rs-binary.csv.part: cannot read as CSV",
    ),
    (["search", "--gpus", "100000000000", *FAST], "--gpus: 100000000000 is above the limit of 65536"),
    (["search", "--conc", "1", "--workers", "0", *FAST], "--workers must be a whole number >= 1, got 0"),
    (["search", "--from", f"{D}/sw-text.csv"], "column output_throughput_tok_s: 'fast' is not a number"),
    (["search", "--from", f"{D}/sw-nan.csv"], "column output_throughput_tok_s: nan is not a finite number"),
    (["search", "--from", f"{D}/sw-inf.csv"], "column output_throughput_tok_s: inf is not a finite number"),
    (["search", "--from", f"{D}/sw-empty.csv"], "has no rows"),
    (["search", "--from", f"{D}/sw-conc-text.csv"], "column conc: 'x' is not a number"),
    (["search", "--from", f"{D}/sw-binary.csv"], "cannot read as CSV"),
    (["search", "--from", f"{D}/sw-nocols.csv"], "is not a pipesim sweep table"),
    (["search", "--from", f"{D}/sw-parquet.parquet"], "cannot read as Parquet"),
    (
        ["search", "--from", f"{D}/sw-ok.csv", "--min-per-request-tok-s", "inf"],
        "--min-per-request-tok-s must be a finite number >= 0",
    ),
    (
        ["search", "--from", f"{D}/sw-ok.csv", "--max-ttft-p99-ms", "-inf"],
        "--max-ttft-p99-ms must be a finite number >= 0",
    ),
    (
        ["plot", f"{D}/sw-text.csv", "--out-dir", f"{D}"],
        "column output_throughput_tok_s: 'fast' is not a number",
    ),
    (
        ["plot", f"{D}/sw-inf.csv", "--out-dir", f"{D}"],
        "column output_throughput_tok_s: inf is not a finite number",
    ),
    (["plot", f"{D}/sw-empty.csv", "--out-dir", f"{D}"], "has no rows"),
    (["plot", f"{D}/sw-binary.csv", "--out-dir", f"{D}"], "cannot read as CSV"),
    (["plot", f"{D}/trace-ok.csv", "--out-dir", f"{D}"], "is not a pipesim sweep table"),
    (["validate", "--max-error", "nan"], "--max-error must be a finite number > 0"),
    (["validate", "--max-error", "-1"], "--max-error must be a finite number > 0"),
    (["validate", "--max-error", "inf"], "--max-error must be a finite number > 0"),
    (["trace", "--conc", "1", "--out", f"{D}/t.csv", *FAST], "must end in .json"),
    (
        ["trace", "--conc", "10000000", "--out", f"{D}/t.json", *FAST],
        "concurrency 10000000 is above the limit of 65536",
    ),
]
# --- profiles: every key's type, non-finite parameters and table cells
CASES += [
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-inf-param", *FAST],
        "cpu_iteration_ms = inf must be a finite number >= 0",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-nan-param", *FAST],
        "cpu_iteration_ms = nan must be a finite number >= 0",
    ),
    (["predict", "--conc", "1", "--profile", f"{D}/p-params-num", *FAST], "'params' must be a table"),
    (["predict", "--conc", "1", "--profile", f"{D}/p-name-num", *FAST], "'name' must be a string"),
    (["predict", "--conc", "1", "--profile", f"{D}/p-engine-list", *FAST], "'engine' must be a string"),
    (["predict", "--conc", "1", "--profile", f"{D}/p-box-num", *FAST], "'box' must be a string"),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-version-num", *FAST],
        "'engine_version' must be a string",
    ),
    (["predict", "--conc", "1", "--profile", f"{D}/p-deploy-str", *FAST], "'deployment' must be a table"),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-deploy-knob", *FAST],
        "--max-running-requests must be a whole number >= 1, got 'many'",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/p-deploy-float", *FAST],
        "--max-running-requests must be a whole number >= 1, got 2.5",
    ),
    (["predict", "--conc", "1", "--profile", f"{D}/p-sources-num", *FAST], "'sources' must be a table"),
    (["predict", "--conc", "1", "--profile", f"{D}/p-binary", *FAST], "is not UTF-8 text"),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-inf-lat", *FAST],
        "column latency_ms: value 'inf' is not allowed",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-ninf-lat", *FAST],
        "column latency_ms: value '-inf' is not allowed",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-inf-size", *FAST],
        "column nbytes: value 'inf' is not allowed",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-frac-gpus", *FAST],
        "column gpus: value '2.5' is not allowed",
    ),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-text-lat", *FAST],
        "column latency_ms: value 'fast' is not allowed",
    ),
    (["predict", "--conc", "1", "--profile", f"{D}/t-empty", *FAST], "collectives.csv.gz has no rows"),
    (
        ["predict", "--conc", "1", "--profile", f"{D}/t-binary", *FAST],
        "collectives.csv.gz: missing column(s) op",
    ),
    (["profiles", "show", f"{D}/p-binary"], "is not UTF-8 text"),
    (["profiles", "show", f"{D}/p-params-num"], "'params' must be a table"),
]
# --- box files
CASES += [
    (["boxes", "show", f"{D}/box-nan-lat.toml"], "latency_us = nan must be a finite number"),
    (["boxes", "show", f"{D}/box-inf-mem.toml"], "gpu.memory_bytes = inf must be a finite number > 0"),
    (["boxes", "show", f"{D}/box-str-mem.toml"], "gpu.memory_bytes = 'big' must be a finite number > 0"),
    (["boxes", "show", f"{D}/box-no-gpu.toml"], "[gpu]"),
    (["boxes", "show", f"{D}/box-links-str.toml"], "topology.links must be a list"),
    (["boxes", "show", f"{D}/box-count-huge.toml"], "gpu.count = 100000000000 is above the limit of 65536"),
    (["boxes", "show", f"{D}/box-binary.toml"], "is not UTF-8 text"),
    (["boxes", "show", f"{D}/box-deep.toml"], "nested too deeply"),
    (["boxes", "show", "rtx-pro-6000-server-8x", "--nodes", "100000000"], "above the limit of 65536"),
    (
        ["predict", "--conc", "1", "--box", f"{D}/box-nan-lat.toml", *FAST],
        "latency_us = nan must be a finite number",
    ),
]
# --- benchmark files and writes: never a user's file lost, no import into a shipped name
_bench = [
    "calibrate",
    "import",
    "bench",
    "--profile",
    P,
    "--format",
    "vllm",
    "--tp",
    "8",
    "--pp",
    "1",
    "--out",
]
CASES += [
    ([*_bench[:3], f"{D}/bench-inf.json", *_bench[3:], f"{D}/o1"], "output_throughput = inf"),
    ([*_bench[:3], f"{D}/bench-nan.json", *_bench[3:], f"{D}/o2"], "output_throughput = nan"),
    ([*_bench[:3], f"{D}/bench-str.json", *_bench[3:], f"{D}/o3"], "output_throughput = '100'"),
    ([*_bench[:3], f"{D}/bench-conc-str.json", *_bench[3:], f"{D}/o4"], "max_concurrency = '4'"),
    ([*_bench[:3], f"{D}/bench-conc-huge.json", *_bench[3:], f"{D}/o5"], "max_concurrency = 1e+308"),
    ([*_bench[:3], f"{D}/bench-conc-frac.json", *_bench[3:], f"{D}/o6"], "max_concurrency = 2.5"),
    ([*_bench[:3], f"{D}/bench-list.json", *_bench[3:], f"{D}/o7"], "is not a JSON object"),
    ([*_bench[:3], f"{D}/bench-binary.json", *_bench[3:], f"{D}/o8"], "is not UTF-8 text"),
    ([*_bench[:3], f"{D}/bench-deep.json", *_bench[3:], f"{D}/o9"], "nested too deeply"),
    ([*_bench[:3], f"{D}/tiny.json", *_bench[3:], P], "is a shipped profile"),
    ([*_bench[:3], f"{D}/tiny.json", *_bench[3:], f"{D}/notaprofile.txt"], "is a file, not a profile folder"),
    ([*_bench[:3], f"{D}/tiny.json", *_bench[3:], f"{D}/plainfolder"], "is a folder without profile.toml"),
    (
        ["calibrate", "import", "nccl-tests", f"{D}/tiny.json", "--profile", P, "--gpus", "8", "--out", P],
        "is a shipped profile",
    ),
    (
        [
            "calibrate",
            "import",
            "nccl-tests",
            f"{D}/tiny.json",
            "--profile",
            P,
            "--gpus",
            "0",
            "--out",
            f"{D}/o10",
        ],
        "--gpus must be a whole number >= 1",
    ),
    (
        ["calibrate", "import", "aiconfigurator", f"{D}", "--box", "rtx-pro-6000-server-8x", "--out", P],
        "is a shipped profile",
    ),
    (
        [
            "calibrate",
            "import",
            "aiconfigurator",
            f"{D}",
            "--box",
            "rtx-pro-6000-server-8x",
            "--out",
            f"{D}/notaprofile.txt",
        ],
        "is a file",
    ),
    (
        [
            "calibrate",
            "fit",
            "--profile",
            f"{D}/target",
            "--params",
            "cpu_iteration_ms",
            "--out",
            f"{D}/notaprofile.txt",
        ],
        "is a file",
    ),
    (
        ["calibrate", "fit", "--profile", f"{D}/target", "--params", "cpu_iteration_ms", "--out", P],
        "is a shipped profile",
    ),
    (
        [
            "calibrate",
            "import",
            "bench",
            f"{D}/bench-inf.json",
            "--profile",
            P,
            "--format",
            "vllm",
            "--tp",
            "2.5",
            "--pp",
            "1",
            "--out",
            f"{D}/o11",
        ],
        "'2.5' is not a valid integer",
    ),
]


def _fill(x, t):
    return x.replace("{t}", str(t))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hostile_files(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize(
    "args, message", CASES, ids=[f"{i}:{' '.join(c[0][:4])[-40:]}" for i, c in enumerate(CASES)]
)
def test_hostile_input(args, message, folder, capsys):
    refused(args, message, folder, capsys)


def snapshot(folder: Path) -> list[tuple]:
    """Every entry of the folder: a file's size and modification time, a link's target."""
    return sorted(
        (p.name, f"-> {os.readlink(p)}")
        if p.is_symlink()
        else (p.name, p.stat().st_size, p.stat().st_mtime_ns)
        if p.is_file()
        else (p.name, "dir")
        for p in folder.iterdir()
    )


def refused(args: list[str], message: str, folder: Path, capsys) -> None:
    """`pipesim ARGS` (DIR filled in) exits 2 with one line holding `message`, and nothing
    in DIR is written, moved, cut or left behind."""
    args = [_fill(a, folder) for a in args]
    before = snapshot(folder)
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 2, (args, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesim: error: ") and "Traceback" not in err, err
    assert message in lines[0], lines[0]
    assert snapshot(folder) == before  # nothing written, moved or left behind
    assert (folder / "notaprofile.txt").read_text() == "keep me"


def test_at_least_150_hostile_cases():
    assert len(CASES) >= 150


def test_every_hostile_case_is_documented():
    doc = re.sub(r"\s+", " ", DOC.read_text())
    for _, message in CASES:
        assert re.sub(r"\s+", " ", message) in doc, message

"""End-to-end check of a live profile: a real decode loop against pipesim's prediction.

    python calibration/e2e_check.py --profile DIR --model llama-3.1-8b [--batches 1,4,16,64]

On the GPU the profile was measured on, Hugging Face transformers `generate` runs the
model built from its config with random weights (no download), greedy, a fixed prompt
and output length and no early stop, `--repeats` times per batch size; tokens/s =
batch x output tokens / wall time (prefill included). pipesim then predicts the same
workload at TP1 x PP1 from the profile: a closed loop of `batch` clients with the same
lengths (every request starts and ends together, as one `generate` call does).

Honest comparison, the choices made:
- `generate` in eager mode launches every kernel from Python, so the prediction runs
  with CUDA graphs off (SGLang's --disable-cuda-graph): an eager step takes
  generate's own per-step cost + max(GPU time, layers x eager_launch_us_per_layer).
  `generate` is not an engine: the prediction drops the engine's host loop
  (host_cpu_factor 0: no scheduler, front end or output path) and charges, as
  cpu_iteration_ms, generate's per-step cost the profile measured ([live]
  hf_step_fixed_ms; a profile can no longer carry it as its own cpu_iteration_ms,
  which an engine's host loop would then pay twice).
- Those two CPU parameters are not fitted to these runs: `calibrate live --hf-config`
  measured them on shallow copies of the model (2-6 layers, batch 1, where the step is
  CPU-bound): the slope of step time over depth is the launch time per layer, the
  intercept the per-step cost outside the layers. GPU time comes from the operation
  tables only. So every batch size here, batch 1 included, is a prediction.
- Random weights route tokens near-uniformly, so MoE is read at the profile's
  'balanced' rows (real models are skewed; the profile's default is power_law_1.01).
Prints measured vs predicted with the error per batch size, and, to tell kernel
errors from CPU errors, the GPU time per decoder layer of the HF code (profiler, from
`calibrate live --hf-config`) against the layer the cost model composes from the
tables. Writes e2e.csv, e2e.json and points.csv (pipesim's measured-point format, a
band from the runs' min to max).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

import pipesim
from pipesim.base.errors import UserError
from pipesim.costs.primitives import Shape
from pipesim.costs.stage import CostModel
from pipesim.inputs.box import load_box
from pipesim.inputs.model import load_model, read_hf_config
from pipesim.inputs.plan import Plan
from pipesim.profiles.measured import COLUMNS
from pipesim.profiles.profile import load_profile

# per-forward (not per-layer) operations of the last stage
ONCE = {"embedding", "embedding all-reduce", "final norm", "lm_head", "logits all-gather", "sampling"}


def measure(
    model_arg: str,
    batches: list[int],
    input_len: int,
    output_len: int,
    repeats: int,
    device: str,
    budget_s: float,
) -> list[dict]:
    """tokens/s of `generate` per batch size: median and spread of `repeats` runs."""
    import torch

    from pipesim.calibrate.live.hf import build_hf_model, generate_once_s

    model = load_model(model_arg)
    dev = torch.device(device)
    if dev.type == "cuda":
        free = torch.cuda.mem_get_info(dev)[0]
        need = model.total_weight_bytes("bf16")  # random bf16 weights, untied embeddings
        if need > 0.85 * free:
            raise UserError(
                f"{model.name}: {need / 1e9:.0f} GB of bf16 weights do not fit in "
                f"{free / 1e9:.0f} GB free on {torch.cuda.get_device_name(dev)}"
            )
    t0 = time.monotonic()
    hf = build_hf_model(read_hf_config(model_arg)[0], dev)
    experts = f"experts {getattr(hf.config, '_experts_implementation', '?')}, " if model.moe else ""
    print(
        f"built {model.name} with random weights in {time.monotonic() - t0:.0f} s ({experts}attention "
        f"{getattr(hf.config, '_attn_implementation', '?')})",
        flush=True,
    )
    rows = []
    for b in batches:
        if time.monotonic() - t0 > budget_s:
            print(f"batch {b}: skipped, past the {budget_s:.0f} s budget", flush=True)
            continue
        # warm-up at full length: a first run at a new size grows the allocator (cudaMalloc) and ran
        # ~2x slower on the lent H200
        generate_once_s(hf, b, input_len, output_len, seed=99)
        walls = [generate_once_s(hf, b, input_len, output_len, seed=r) for r in range(repeats)]
        rates = sorted(b * output_len / w for w in walls)
        med = statistics.median(rates)
        rows.append(
            {
                "batch": b,
                "measured_tok_s": med,
                "measured_lo": rates[0],
                "measured_hi": rates[-1],
                "spread_pct": 100 * (rates[-1] - rates[0]) / med,
                "wall_s": statistics.median(walls),
                "runs_tok_s": [round(r, 2) for r in rates],
            }
        )
        print(f"batch {b:4d}: {med:9.1f} tok/s  (runs {', '.join(f'{r:.1f}' for r in rates)})", flush=True)
    del hf
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def predict(
    rows: list[dict], profile_dir: str, model_arg: str, box: str, input_len: int, output_len: int
) -> None:
    """Add pipesim's prediction for each measured batch size (in place)."""
    profile = load_profile(profile_dir)
    # Hugging Face generate's loop, not an engine's (module docstring)
    fixed = profile.meta.get("live", {}).get("hf_step_fixed_ms", profile.params.cpu_iteration_ms)
    profile = profile.with_params(host_cpu_factor=0.0, cpu_iteration_ms=float(fixed))
    if load_model(model_arg).moe:
        params = dataclasses.replace(profile.params, moe_distribution="balanced")
        profile = dataclasses.replace(profile, params=params)
    for row in rows:
        r = pipesim.predict(
            tp=1,
            pp=1,
            conc=row["batch"],
            model=model_arg,
            profile=profile,
            box=box,
            input_len=str(input_len),
            output_len=str(output_len),
            disable_cuda_graph=True,
        )
        row["predicted_tok_s"] = r.output_throughput_tok_s
        row["predicted_tpot_ms"] = r.tpot_ms_p50
        row["measured_tpot_ms"] = row["batch"] / row["measured_tok_s"] * 1e3
        row["error_pct"] = 100 * (row["predicted_tok_s"] - row["measured_tok_s"]) / row["measured_tok_s"]


def layer_gpu(profile_dir: str, model_arg: str, box: str) -> list[dict]:
    """GPU ms per decoder layer at each batch the calibration ran the HF model: its kernels
    (profiler) and the cost model's composition from the tables, at the same context."""
    path = Path(profile_dir) / "live_extras.csv"
    if not path.is_file():
        return []
    extras = pd.read_csv(path)
    profile = load_profile(profile_dir)
    model = load_model(model_arg)
    if model.moe:
        profile = dataclasses.replace(
            profile, params=dataclasses.replace(profile.params, moe_distribution="balanced")
        )
    cm = CostModel(load_box(box), model, Plan(1, 1, (model.num_layers,)), profile)
    out = []
    for row in extras[extras["op"] == "hf_layer_kernels"].itertuples():
        p = dict(kv.split("=") for kv in row.params.split(";"))
        b, ctx = int(p["batch"]), int(p["context"]) + 24  # the timed tokens were the 9th to the 40th
        ops = cm.stage_ops(0, Shape(decode=b, decode_ctx=ctx))
        tables = sum(o.seconds * o.count for o in ops if o.kind == "compute" and o.name not in ONCE)
        tables_ms = tables / model.num_layers * 1e3
        out.append(
            {
                "batch": b,
                "hf_kernels_ms": float(row.value),
                "tables_ms": tables_ms,
                "ratio": float(row.value) / tables_ms,
            }
        )
    return out


def report(rows: list[dict]) -> str:
    lines = [
        f"{'batch':>5}  {'measured tok/s':>14}  {'spread':>7}  {'predicted tok/s':>15}  {'error':>7}",
        "-" * 56,
    ]
    for r in rows:
        lines.append(
            f"{r['batch']:>5}  {r['measured_tok_s']:>14.1f}  {r['spread_pct']:>6.1f}%  "
            f"{r['predicted_tok_s']:>15.1f}  {r['error_pct']:>+6.1f}%"
        )
    errs = [abs(r["error_pct"]) for r in rows]
    if errs:
        lines.append(f"mean |error| {statistics.mean(errs):.1f}%, max {max(errs):.1f}%")
    return "\n".join(lines)


def points(rows: list[dict], model_arg: str, input_len: int, output_len: int, source: str) -> pd.DataFrame:
    """The runs as measured points (pipesim.profiles.measured's columns) for `pipesim validate`/`fit`."""
    out = [
        {
            "name": f"HF generate b{r['batch']}",
            "model": model_arg,
            "engine": "sglang",
            "tp": 1,
            "pp": 1,
            "conc": r["batch"],
            "input_len": input_len,
            "output_len": output_len,
            "metric": "output_tok_s",
            "tok_s": round(r["measured_tok_s"], 3),
            "tok_s_lo": round(r["measured_lo"], 3),
            "tok_s_hi": round(r["measured_hi"], 3),
            "ttft_ms": "",
            "tpot_ms": "",
            "max_running_requests": "",
            "pp_max_micro_batch_size": "",
            "pp_async_batch_depth": "",
            "disable_cuda_graph": "true",
            "source": source,
        }
        for r in rows
    ]
    return pd.DataFrame(out, columns=list(COLUMNS))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True, help="profile directory written by pipesim calibrate live")
    ap.add_argument("--model", required=True, help="the profile's model: preset name or HF config.json")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--box", default="h200-1x", help="box preset or .toml for the prediction")
    ap.add_argument("--out-dir", default=None, help="folder for e2e.csv, e2e.json, points.csv")
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop starting new batch sizes after this")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the tests
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("e2e_check: error: needs torch and transformers: pip install 'pipesim[live]'", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("e2e_check: error: no NVIDIA GPU is visible", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    try:
        rows = measure(
            args.model, batches, args.input_len, args.output_len, args.repeats, args.device, args.budget_s
        )
        predict(rows, args.profile, args.model, args.box, args.input_len, args.output_len)
    except UserError as exc:
        print(f"e2e_check: error: {exc}", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(
        f"\n{args.model}: HF generate (eager, random weights) on {gpu}, prompt {args.input_len}, "
        f"output {args.output_len} tokens, median of {args.repeats} runs; pipesim TP1 x PP1 from {args.profile}, "
        "CUDA graphs off"
    )
    print(report(rows))
    layers = layer_gpu(args.profile, args.model, args.box)
    if layers:
        print(
            "\nGPU time per decoder layer: the HF code's kernels (profiler, calibrate --hf-config) vs the tables"
        )
        print(f"{'batch':>5}  {'HF kernels ms':>13}  {'tables ms':>9}  {'HF / tables':>11}")
        for r in layers:
            print(
                f"{r['batch']:>5}  {r['hf_kernels_ms']:>13.4f}  {r['tables_ms']:>9.4f}  {r['ratio']:>11.2f}"
            )
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([{k: v for k, v in r.items() if k != "runs_tok_s"} for r in rows]).to_csv(
            out / "e2e.csv", index=False
        )
        (out / "e2e.json").write_text(
            json.dumps(
                {
                    "model": args.model,
                    "gpu": gpu,
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "rows": rows,
                    "layer_gpu": layers,
                },
                indent=1,
            )
        )
        source = f"HF transformers generate on {gpu}, random weights, eager, {time.strftime('%Y-%m-%d')}"
        points(rows, args.model, args.input_len, args.output_len, source).to_csv(
            out / "points.csv", index=False
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The steady-state model (pipesim/scenario/steady_model.py) against the simulation, over
a stated grid: its error distribution, written to a CSV and summarised.

Grid: every split of 8 GPUs (TP8, TP4 x PP2, TP2 x PP4, PP8) at C in {1, 8, 32, 64,
128, 256}, SGLang and vLLM, three models (Kimi K2.6 with the reference deployment's
profile, Llama-3.1-70B and Qwen3-30B-A3B with SGLang's defaults), on the reference box
(8 x RTX PRO 6000); then a KV-tight case, PP with async depth 1 and 2, data parallel,
lengths that vary, open loops, and the host loop by release (Llama-3.1-8B, TP1, one
H100: vLLM V0 0.6.3.post1, V1 0.19 with and without async scheduling and eager, SGLang
0.5.14 with and without the overlap scheduler and eager, C in {1 .. 256}) and the
output path that four replicas share (Qwen3-30B-A3B, TP2 x DP4 on 8 x H200, C in
{256, 512, 1024}). Each case is built once and given to both.

    python calibration/validate_steady_model.py --out calibration/steady_model_errors.csv

writes the CSV (a row per case: the model's point, bracket, domain and notes, the
simulation's figures, the relative errors), prints the summary that docs/search.md §2
quotes (per metric: median and 90th percentile |error| of the point in the model's
domain and bracketed, how far the simulation lies outside the bracket, the worst cases),
and with --error-json the 90th percentiles of the point's error in the domain, which a
search's screen widens the model's bracket by (pipesim/data/steady_model_error.json).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

METRICS = {  # model field -> the simulation's field it is checked against
    "output_throughput_tok_s": "output_throughput_tok_s",
    "ttft_ms": "ttft_ms_mean",
    "tpot_ms": "tpot_ms_mean",
}
SPLITS = ((8, 1), (4, 2), (2, 4), (1, 8))
CONCURRENCY = (1, 8, 32, 64, 128, 256)
# the host loop by release (docs/host-loop.md §7): where it hides the CPU and where it
# does not, on a model whose GPU step is short (Llama-3.1-8B, one H100)
HOST_LOOP_MODES = (
    dict(engine="vllm", engine_version="0.6.3.post1"),  # V0, async output processor
    dict(engine="vllm", engine_version="0.19.0"),  # V1, async scheduling (its default)
    dict(engine="vllm", engine_version="0.19.0", async_scheduling=False),
    dict(engine="vllm", engine_version="0.19.0", enforce_eager=True),
    dict(engine="sglang", engine_version="0.5.14"),  # the overlap scheduler (its default)
    dict(engine="sglang", engine_version="0.5.14", disable_overlap_schedule=True),
    dict(engine="sglang", engine_version="0.5.14", disable_cuda_graph=True),
)
MODELS = {  # model -> (SGLang profile, vLLM profile)
    "kimi-k2.6": ("rtx-pro-6000-sglang-deployment", "rtx-pro-6000-vllm"),
    "llama-3.1-70b": ("rtx-pro-6000-sglang-healthy", "rtx-pro-6000-vllm"),
    "qwen3-30b-a3b": ("rtx-pro-6000-sglang-healthy", "rtx-pro-6000-vllm"),
}


def grid() -> list[dict]:
    """Every case: build_scenario keywords, with a `case` label."""
    out = []
    for model, (sglang, vllm) in MODELS.items():
        for engine, profile in (("sglang", sglang), ("vllm", vllm)):
            for tp, pp in SPLITS:
                for c in CONCURRENCY:
                    out.append(
                        dict(
                            case="grid",
                            model=model,
                            profile=profile,
                            engine=engine,
                            tp=tp,
                            pp=pp,
                            concurrency=c,
                        )
                    )
    extra = [
        dict(case="kv-tight", tp=1, pp=8, concurrency=64, output_len=1000, mem_fraction_static=0.79),
        dict(case="kv-tight", tp=2, pp=4, concurrency=128, output_len=2000, mem_fraction_static=0.8),
        *(
            dict(case="async-depth", tp=tp, pp=pp, concurrency=c, pp_async_batch_depth=d)
            for tp, pp in ((2, 4), (1, 8))
            for c in (8, 64, 256)
            for d in (1, 2)
        ),
        dict(case="data-parallel", tp=8, pp=1, concurrency=64, dp=2, dp_attention=True),
        dict(case="data-parallel", tp=8, pp=1, concurrency=128, dp=4, dp_attention=True, ep=8),
        dict(case="data-parallel", engine="vllm", model="qwen3-30b-a3b", tp=4, pp=1, concurrency=64, dp=2),
        dict(
            case="data-parallel",
            model="llama-3.1-70b",
            profile="rtx-pro-6000-sglang-healthy",
            tp=4,
            pp=1,
            dp=2,
            concurrency=128,
        ),
        *(
            dict(
                case="lengths-vary",
                engine=e,
                tp=tp,
                pp=pp,
                concurrency=c,
                input_len="100:400",
                output_len="200:400",
            )
            for e in ("sglang", "vllm")
            for tp, pp in ((8, 1), (2, 4))
            for c in (16, 64)
        ),
        *(
            dict(case="open-loop", engine=e, tp=tp, pp=pp, rate_rps=r, num_requests=200)
            for e in ("sglang", "vllm")
            for tp, pp in ((8, 1), (2, 4))
            for r in (0.25, 1.0, 3.0)
        ),
        *(  # four replicas behind one front end: its output path near and past saturation
            dict(case="output-path", model="qwen3-30b-a3b", box="h200-sxm-8x", tp=2, dp=4, concurrency=c)
            for c in (256, 512, 1024)
        ),
        *(
            dict(case="host-loop", model="llama-3.1-8b", box="h100-sxm-8x", tp=1, pp=1, concurrency=c, **mode)
            for mode in HOST_LOOP_MODES
            for c in (1, 8, 32, 64, 128, 256)
        ),
    ]
    return out + extra


def run_case(kw: dict) -> dict:
    """Model and simulation of one case (in a worker process)."""
    from pipesim import api
    from pipesim.base.errors import UserError
    from pipesim.scenario.build import build_scenario
    from pipesim.scenario.steady_model import estimate

    kw = dict(kw)
    case = kw.pop("case")
    row = {
        "case": case,
        **{k: kw.get(k, "") for k in ("model", "engine", "tp", "pp", "dp", "concurrency", "rate_rps")},
    }
    row["options"] = ";".join(f"{k}={v}" for k, v in kw.items() if k not in row)
    try:
        sc = build_scenario(**kw)
    except UserError as exc:
        return {**row, "skipped": str(exc)}
    t = time.process_time()
    est = estimate(sc)
    model_s = time.process_time() - t
    t = time.process_time()
    res = api.run(sc)
    sim_s = time.process_time() - t
    row.update(
        model=sc.model.name,
        engine=sc.settings.describe()["engine"],
        domain=est.domain,
        notes=" | ".join(est.notes),
        occupancy="/".join(map(str, est.occupancy)),
        admitted=est.admitted,
        model_cpu_s=model_s,
        sim_cpu_s=sim_s,
        sim_preemptions=res.preemptions,
        sim_overloaded=bool((res.saturation or {}).get("overloaded", False)),
        model_overloaded=est.overloaded,
    )
    for m, sim_field in METRICS.items():
        point, (lo, hi) = getattr(est, m), est.bounds[m]
        sim = getattr(res, sim_field)
        row[f"model_{m}"], row[f"model_{m}_lo"], row[f"model_{m}_hi"] = point, lo, hi
        row[f"sim_{m}"] = sim
        row[f"err_{m}"] = point / sim - 1.0 if sim and point == point else math.nan
        # how far the simulation lies from the model's bracket (0 inside it; the point's
        # error where the bracket is the point): what a search's band must cover
        row[f"bracket_err_{m}"] = (
            (0.0 if lo <= sim <= hi else (lo if sim < lo else hi) / sim - 1.0)
            if sim and lo == lo
            else math.nan
        )
    row["sim_ttft_ms_p50"], row["sim_tpot_ms_p50"] = res.ttft_ms_p50, res.tpot_ms_p50
    return row


def quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return math.nan
    i = (len(v) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def summary(rows: list[dict]) -> tuple[str, dict]:
    """The error distribution as text (markdown tables), and the 90th percentiles per
    metric of the point's |error| over the cases in the model's domain, where the
    bracket is the point (the screen's band: a bracket widened by it; a bracketed
    case's simulation lies in its bracket or, in the table, this far outside it)."""
    ran = [r for r in rows if not r.get("skipped")]
    lines = [f"{len(ran)} cases run, {len(rows) - len(ran)} skipped (do not fit)"]
    by_domain = {d: [r for r in ran if r["domain"] == d] for d in ("in", "bracketed", "outside")}
    lines.append("domain: " + ", ".join(f"{d} {len(v)}" for d, v in by_domain.items()))
    inside = by_domain["in"] + by_domain["bracketed"]
    p90 = {m: round(quantile([abs(r[f"err_{m}"]) for r in by_domain["in"]], 0.9), 4) for m in METRICS}
    lines.append("")
    lines.append(
        "| metric | cases | median abs error | 90th pct abs error | worst | outside the bracket: median, 90th pct "
        "| band holds the simulation |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for m in METRICS:
        for label, part in (("in", by_domain["in"]), ("bracketed", by_domain["bracketed"]), ("both", inside)):
            errs = [abs(r[f"err_{m}"]) for r in part]
            out_of = [abs(r[f"bracket_err_{m}"]) for r in part]
            held = sum(_in_band(r, m, p90[m]) for r in part)
            lines.append(
                f"| {m} ({label}) | {len(errs)} | {quantile(errs, 0.5):.1%} | {quantile(errs, 0.9):.1%} | "
                f"{max(errs, default=math.nan):.1%} | {quantile(out_of, 0.5):.1%}, {quantile(out_of, 0.9):.1%} "
                f"| {held}/{len(part)} |"
            )
    out = by_domain["outside"]
    held = sum(r[f"sim_{METRICS_FIRST}"] <= r[f"model_{METRICS_FIRST}_hi"] for r in out)
    lines.append("")
    lines.append(f"outside the domain: the throughput bound is above the simulation in {held}/{len(out)}")
    for r in out:
        lines.append(f"  {_name(r)}: {r['notes']}")
    lines.append("")
    lines.append("by case (throughput, median and worst abs error):")
    for case in dict.fromkeys(r["case"] for r in inside):
        errs = [abs(r[f"err_{METRICS_FIRST}"]) for r in inside if r["case"] == case]
        lines.append(f"  {case}: {len(errs)} cases, {quantile(errs, 0.5):.1%}, {max(errs):.1%}")
    for m in METRICS:
        lines.append(f"worst {m}, the point:")
        for r in sorted(inside, key=lambda r: -abs(r[f"err_{m}"]))[:5]:
            lines.append(
                f"  {r[f'err_{m}']:+.1%} {_name(r)} [{r['domain']}] occupancy {r['occupancy']} {r['notes']}"
            )
        lines.append(f"worst {m}, outside the bracket:")
        for r in sorted(inside, key=lambda r: -abs(r[f"bracket_err_{m}"]))[:5]:
            lines.append(
                f"  {r[f'bracket_err_{m}']:+.1%} {_name(r)} [{r['domain']}] occupancy {r['occupancy']} "
                f"{r['notes']}"
            )
    model_s = sum(r["model_cpu_s"] for r in ran)
    sim_s = sum(r["sim_cpu_s"] for r in ran)
    lines.append(
        f"CPU: the model {model_s:.2f} s ({model_s / len(ran) * 1e3:.1f} ms a case, a fresh cost model each), "
        f"the simulation {sim_s:.1f} s ({sim_s / len(ran):.2f} s a case): {sim_s / model_s:.0f}x"
    )
    return "\n".join(lines), p90


METRICS_FIRST = "output_throughput_tok_s"


def _in_band(r: dict, m: str, error: float) -> bool:
    return r[f"model_{m}_lo"] / (1 + error) <= r[f"sim_{m}"] <= r[f"model_{m}_hi"] * (1 + error)


def _name(r: dict) -> str:
    load = f"C={r['concurrency']}" if r["concurrency"] not in ("", None) else f"{r['rate_rps']} req/s"
    dp = f" DP{r['dp']}" if r["dp"] not in ("", None, 1) else ""
    return f"{r['engine']} {r['model']} TP{r['tp']}xPP{r['pp']}{dp} {load} {r['options']}".strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="calibration/steady_model_errors.csv")
    ap.add_argument("--error-json", default=None, help="write the 90th percentiles here (the screen's band)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    cases = grid()
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(run_case, cases, chunksize=1))
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    text, p90 = summary(rows)
    print(text)
    if args.error_json:
        Path(args.error_json).write_text(
            json.dumps(
                {
                    "what": "90th percentile |model / simulation - 1| over the grid of "
                    "calibration/validate_steady_model.py, in the model's domain (where its bracket is "
                    "its point); a search widens every bracket by it",
                    "cases": sum(1 for r in rows if not r.get("skipped") and r["domain"] == "in"),
                    "p90_abs_error": p90,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()

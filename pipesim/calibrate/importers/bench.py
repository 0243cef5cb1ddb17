"""Read end-to-end benchmark results into measured points.

- SGLang `bench_serving` appends one JSON line per run; an unbounded request rate is the
  bare token `Infinity` (Python's json reads it).
- vLLM `vllm bench serve` writes one JSON object; an unbounded rate is the string "inf".
- A plain CSV in the layout of pipesim.measured.

Unknown keys are ignored: they drift between versions. The benchmarks do not record
the parallel split, so tp and pp come from the command line.
"""

from __future__ import annotations

import json

import pandas as pd

from ...errors import UserError, require
from ..measured import COLUMNS


def _rows_from_json(objs: list[dict], origin: str, tp: int, pp: int, extra: dict) -> pd.DataFrame:
    rows = []
    for i, o in enumerate(objs, start=1):
        require(isinstance(o, dict), f"{origin}: record {i} is not a JSON object")
        out = o.get("output_throughput")
        require(isinstance(out, (int, float)) and out > 0,
                f"{origin}: record {i} has no positive output_throughput (tok/s)")
        conc = o.get("max_concurrency") or o.get("concurrency") or extra.get("conc")
        require(isinstance(conc, (int, float)) and conc >= 1,
                f"{origin}: record {i} has no max_concurrency; pass --conc")
        done = o.get("completed") or 0
        in_len = round(o["total_input_tokens"] / done) if done and o.get("total_input_tokens") else ""
        out_len = round(o["total_output_tokens"] / done) if done and o.get("total_output_tokens") else ""
        rows.append({"name": extra.get("name", ""), "model": extra.get("model", ""), "engine": extra.get("engine", ""),
                     "tp": tp, "pp": pp, "conc": int(round(conc)), "input_len": in_len, "output_len": out_len,
                     "metric": "output_tok_s", "tok_s": float(out), "tok_s_lo": "", "tok_s_hi": "",
                     "ttft_ms": _blank(o.get("median_ttft_ms")), "tpot_ms": _blank(o.get("median_tpot_ms")),
                     "source": extra.get("source", origin)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _blank(value):
    return "" if value is None else value


def parse_sglang(text: str, origin: str, tp: int, pp: int, **extra) -> pd.DataFrame:
    objs = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                objs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{origin}: line {n} is not JSON ({exc.msg})") from None
    require(objs, f"{origin}: no results (expected one JSON object per line from SGLang bench_serving)")
    return _rows_from_json(objs, origin, tp, pp, {**extra, "engine": extra.get("engine") or "sglang"})


def parse_vllm(text: str, origin: str, tp: int, pp: int, **extra) -> pd.DataFrame:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin}: not JSON ({exc.msg} at line {exc.lineno})") from None
    objs = obj if isinstance(obj, list) else [obj]
    return _rows_from_json(objs, origin, tp, pp, {**extra, "engine": extra.get("engine") or "vllm"})

"""Read end-to-end benchmark results into measured points.

- SGLang `bench_serving` appends one JSON line per run; an unbounded request rate is the
  bare token `Infinity` (Python's json reads it).
- vLLM `vllm bench serve` writes one JSON object; an unbounded rate is the string "inf".
  With `--append-result` each run's object is appended to the file after a newline
  (vllm/benchmarks/serve.py, main_async: mode "a+", "\n" before every object but the
  first), so the file is JSON lines; both forms are read.
- A plain CSV in the layout of pipesim.measured.

Unknown keys are ignored: they drift between versions. The benchmarks do not record
the parallel split; `vllm bench serve --metadata tp=8 pp=1` stores what it is given as
top-level text keys (its help's own example is `tp=1`), so a record's `tp` / `pp` (or
`tp_size`, `tensor_parallel_size`, `pp_size`, `pipeline_parallel_size`) give its split,
else the command line's --tp and --pp; the two disagreeing is refused.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ...base.checks import MAX_CONCURRENCY, is_int, is_number, parse_json, read_text, too_deep
from ...base.errors import UserError, require
from ..measured import COLUMNS

if TYPE_CHECKING:
    from ..profile import Profile
    from ..writing import Edit


# a record's split, as `--metadata KEY=VALUE` may have stored it (values are text)
SPLIT_KEYS = {
    "tp": ("tp", "tp_size", "tensor_parallel_size"),
    "pp": ("pp", "pp_size", "pipeline_parallel_size"),
}


def _split(o: dict, name: str, given: int | None, origin: str, i: int) -> int:
    """The record's tp or pp: its metadata, else the command line's (one line if neither,
    or if they differ)."""
    found = [(k, o[k]) for k in SPLIT_KEYS[name] if o.get(k) not in (None, "")]
    if not found:
        require(
            given is not None,
            f"{origin}: record {i} does not record its {name}; pass --tp and --pp "
            f"(or run vllm bench serve with --metadata tp=N pp=N)",
        )
        assert given is not None
        return given
    key, raw = found[0]
    text = str(raw).strip()
    require(
        text.isdigit() and 1 <= int(text) <= 1024,
        f"{origin}: record {i}: {key} = {raw!r} must be a whole number from 1 to 1024",
    )
    value = int(text)
    require(
        given is None or given == value,
        f"{origin}: record {i} says {key}={value} but --{name} {given} was given; give the run's own",
    )
    return value


def _rows_from_json(
    objs: list[dict], origin: str, tp: int | None, pp: int | None, extra: dict
) -> pd.DataFrame:
    rows = []
    for i, o in enumerate(objs, start=1):
        require(isinstance(o, dict), f"{origin}: record {i} is not a JSON object")
        run_tp, run_pp = _split(o, "tp", tp, origin, i), _split(o, "pp", pp, origin, i)
        out = o.get("output_throughput")
        if not (is_number(out) and math.isfinite(out) and out > 0):
            raise UserError(
                f"{origin}: record {i} has no positive output_throughput (tok/s): output_throughput = {out!r}"
            )
        conc = o.get("max_concurrency") or o.get("concurrency") or extra.get("conc")
        if conc is None:
            raise UserError(f"{origin}: record {i} has no max_concurrency; pass --conc")
        require(
            is_int(conc) or (is_number(conc) and math.isfinite(conc) and conc == int(conc)),
            f"{origin}: record {i}: max_concurrency = {conc!r} must be a whole number from 1 to {MAX_CONCURRENCY}",
        )
        require(
            1 <= conc <= MAX_CONCURRENCY,
            f"{origin}: record {i}: max_concurrency = {conc!r} must be a whole number from 1 to {MAX_CONCURRENCY}",
        )
        for key in (
            "completed",
            "total_input_tokens",
            "total_output_tokens",
            "median_ttft_ms",
            "median_tpot_ms",
        ):
            v = o.get(key)
            require(
                v is None or (is_number(v) and math.isfinite(v) and v >= 0),
                f"{origin}: record {i}: {key} = {v!r} must be a finite number >= 0",
            )
        done = o.get("completed") or 0
        in_len = round(o["total_input_tokens"] / done) if done and o.get("total_input_tokens") else ""
        out_len = round(o["total_output_tokens"] / done) if done and o.get("total_output_tokens") else ""
        rows.append(
            {
                "name": extra.get("name", ""),
                "model": extra.get("model", ""),
                "engine": extra.get("engine", ""),
                "tp": run_tp,
                "pp": run_pp,
                "conc": int(round(conc)),
                "input_len": in_len,
                "output_len": out_len,
                "metric": "output_tok_s",
                "tok_s": float(out),
                "tok_s_lo": "",
                "tok_s_hi": "",
                "ttft_ms": _blank(o.get("median_ttft_ms")),
                # the benchmarks write a TPOT of 0 where no request decoded (one-token
                # outputs: no interval between tokens); it is not defined, left blank
                "tpot_ms": ""
                if out_len == 1 and not o.get("median_tpot_ms")
                else _blank(o.get("median_tpot_ms")),
                "source": extra.get("source", origin),
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _blank(value: object) -> object:
    return "" if value is None else value


def _json_lines(text: str, origin: str) -> list:
    objs = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                require(not too_deep(line), f"{origin}: line {n} is nested too deeply")
                objs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UserError(f"{origin}: line {n} is not JSON ({exc.msg})") from None
    return objs


def parse_sglang(text: str, origin: str, tp: int | None, pp: int | None, **extra: object) -> pd.DataFrame:
    objs = _json_lines(text, origin)
    require(objs, f"{origin}: no results (expected one JSON object per line from SGLang bench_serving)")
    return _rows_from_json(objs, origin, tp, pp, {**extra, "engine": extra.get("engine") or "sglang"})


def parse_vllm(text: str, origin: str, tp: int | None, pp: int | None, **extra: object) -> pd.DataFrame:
    """One `vllm bench serve` result (a JSON object, or a list of them), or a file it
    appended several to (--append-result: one object per line)."""
    try:
        obj = parse_json(text, origin)
    except UserError:
        if len([line for line in text.splitlines() if line.strip()]) < 2:
            raise
        obj = _json_lines(text, origin)  # --append-result: its errors name the line
    objs = obj if isinstance(obj, list) else [obj]
    require(objs, f"{origin}: no results (expected vllm bench serve's JSON)")
    return _rows_from_json(objs, origin, tp, pp, {**extra, "engine": extra.get("engine") or "vllm"})


def import_file(
    file: str | Path,
    profile_dir: str | Path,
    out: str | Path | None = None,
    *,
    fmt: str,
    tp: int | None = None,
    pp: int | None = None,
    conc: int | None = None,
    name: str = "",
    model: str = "",
) -> tuple[int, int]:
    """Add a benchmark's runs to a profile's measured points (in place unless `out`),
    each checked as a hand-written measured.csv row would be. Returns (points added,
    points in all)."""
    from ..measured import points_frame, read_points
    from ..profile import load_profile
    from ..writing import check_profile_out, rewrite_profile

    check_profile_out(profile_dir if out is None else out)
    path = Path(file)
    require(path.is_file(), f"benchmark output not found: {file}")
    prof = load_profile(profile_dir)
    default_model = prof.meta.get("model", "kimi-k2.6")
    if fmt == "csv":
        new = points_frame(read_points(path, str(file), default_model, prof.engine))
    else:
        if fmt != "vllm" and (tp is None or pp is None):  # vLLM's records state their split
            raise UserError(f"--tp and --pp are needed: {fmt} benchmark output does not record the split")
        parse = parse_sglang if fmt == "sglang" else parse_vllm
        rows = parse(
            read_text(path, "benchmark output"), str(file), tp, pp, conc=conc, name=name, model=model
        )
        # read back through the checker: same validation as a hand-written CSV
        new = points_frame(
            read_points(io.StringIO(rows.to_csv(index=False)), str(file), default_model, prof.engine)
        )
    total = 0

    def edit(prof: Profile) -> Edit:
        """The points added to the profile's as they are when its lock is held."""
        nonlocal total
        old = points_frame(list(prof.measured)) if prof.measured else None
        merged = pd.concat([old, new]) if old is not None else new
        total = len(merged)
        return {"measured": merged}

    rewrite_profile(profile_dir, out, edit=edit)
    return len(new), total

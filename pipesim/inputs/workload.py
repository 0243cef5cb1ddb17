"""Workloads: who sends requests, when, and how long they are.

- closed loop: C clients, each sends its next request when its last one finishes
  (the reference deployment's benchmark);
- open loop: Poisson arrivals at a rate;
- trace: replay of a CSV with arrival_s,input_tokens,output_tokens.

All randomness comes from one numpy Generator seeded from the workload's seed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..base.errors import UserError, require

# The default stands for the reference deployment's benchmark: generic coding /
# explanation prompts, short prompts and a few hundred output tokens (physics.md §1).
DEFAULT_INPUT_LEN = "256"
DEFAULT_OUTPUT_LEN = "300"
# an open loop's arrival gaps are drawn this many at a time (the same numbers as one
# draw of all of them: numpy's Generator draws them one after another)
ARRIVAL_CHUNK = 4096


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: fixed (lo == hi) or uniform on [lo, hi]."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str | int, what: str) -> Lengths:
        s = str(text).strip()
        try:
            lo, hi = (int(p) for p in s.split(":", 1)) if ":" in s else (int(s), int(s))
        except ValueError:
            raise UserError(
                f"{what} '{s}' is not a token count; allowed: N (fixed) or LO:HI (uniform), whole numbers >= 1"
            ) from None
        require(1 <= lo <= hi, f"{what} '{s}': need 1 <= LO <= HI")
        return cls(lo, hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.lo == self.hi:
            return np.full(n, self.lo, dtype=np.int64)
        return rng.integers(self.lo, self.hi + 1, size=n)

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


@dataclass(frozen=True)
class Workload:
    kind: str  # "closed", "poisson" or "trace"
    input_len: Lengths
    output_len: Lengths
    concurrency: int = 0  # closed loop
    rate_rps: float = 0.0  # poisson
    num_requests: int = 0  # poisson / trace: how many to send (0: all of the trace)
    trace: tuple = ()  # trace rows (arrival_s, input_tokens, output_tokens)
    trace_path: str = ""
    seed: int = 0

    @property
    def max_request_tokens(self) -> int:
        if self.kind == "trace":
            return max(i + o for _, i, o in self.trace)
        return self.input_len.hi + self.output_len.hi

    def describe(self) -> dict:
        d = {"kind": self.kind, "seed": self.seed}
        if self.kind == "closed":
            d.update(
                concurrency=self.concurrency, input_len=str(self.input_len), output_len=str(self.output_len)
            )
        elif self.kind == "poisson":
            d.update(
                rate_rps=self.rate_rps,
                num_requests=self.num_requests,
                input_len=str(self.input_len),
                output_len=str(self.output_len),
            )
        else:
            d.update(trace=self.trace_path, num_requests=len(self.trace))
        return d


class ArrivalPlan:
    """An open loop's arrivals: the gaps between them in the order the run takes them,
    and its first and last arrival time before the run starts (the saturation rule
    needs them: saturation.py).

    Poisson gaps are drawn from the run's generator first, before any request length,
    as they always have been, so that the lengths drawn after them are the same
    numbers; the run then takes them from a copy of the generator as it was, a chunk
    at a time, so that no array of every gap is held. A trace's times are its own.
    Times are added up as the simulation adds them (now + gap), so the first and last
    are exactly the run's."""

    def __init__(self, workload: Workload, rng: np.random.Generator) -> None:
        self.workload = workload
        self.span_s: tuple[float, float] | None = None
        if workload.kind == "poisson":
            self._rng = copy.deepcopy(rng)
            first, t, left = None, 0.0, workload.num_requests
            while left > 0:
                k = min(ARRIVAL_CHUNK, left)
                times = np.add.accumulate(
                    np.concatenate(([t], rng.exponential(1.0 / workload.rate_rps, size=k)))
                )
                first = float(times[1]) if first is None else first
                t, left = float(times[-1]), left - k
            self.span_s = (first, t) if first is not None else None
        elif workload.kind == "trace":
            now, first = 0.0, None
            for arrival_s, _, _ in workload.trace:  # simulation._arrivals' arithmetic
                if arrival_s > now:
                    now = now + (arrival_s - now)
                first = now if first is None else first
            self.span_s = (first, now) if first is not None else None

    def gaps(self) -> Iterator[float]:
        """A Poisson loop's gaps between arrivals (the first: from time 0)."""
        left, scale = self.workload.num_requests, 1.0 / self.workload.rate_rps
        while left > 0:
            k = min(ARRIVAL_CHUNK, left)
            yield from (float(g) for g in self._rng.exponential(scale, size=k))
            left -= k


def closed_loop(
    concurrency: int, input_len: str | int = "256", output_len: str | int = "300", seed: int = 0
) -> Workload:
    require(
        isinstance(concurrency, int) and concurrency >= 1,
        f"concurrency must be a whole number >= 1, got {concurrency}",
    )
    return Workload(
        "closed",
        Lengths.parse(input_len, "input length"),
        Lengths.parse(output_len, "output length"),
        concurrency=concurrency,
        seed=seed,
    )


def poisson(
    rate_rps: float,
    num_requests: int,
    input_len: str | int = "256",
    output_len: str | int = "300",
    seed: int = 0,
) -> Workload:
    require(rate_rps > 0, f"arrival rate must be > 0 requests/s, got {rate_rps}")
    require(num_requests >= 1, f"number of requests must be >= 1, got {num_requests}")
    return Workload(
        "poisson",
        Lengths.parse(input_len, "input length"),
        Lengths.parse(output_len, "output length"),
        rate_rps=float(rate_rps),
        num_requests=int(num_requests),
        seed=seed,
    )


# Vidur's trace replay columns (vidur/request_generator/
# trace_replay_request_generator.py: arrived_at in seconds, num_prefill_tokens,
# num_decode_tokens; other columns ignored) -> pipesim's
VIDUR_COLUMNS = {
    "arrived_at": "arrival_s",
    "num_prefill_tokens": "input_tokens",
    "num_decode_tokens": "output_tokens",
}


def from_trace(path: str | Path, num_requests: int = 0, seed: int = 0) -> Workload:
    """A trace CSV (arrival_s,input_tokens,output_tokens, or Vidur's arrived_at,
    num_prefill_tokens,num_decode_tokens). Every cell is checked: arrivals finite
    seconds >= 0 within the simulated horizon, token counts whole numbers >= 1. Rows
    need not be sorted: they are replayed in arrival order (a stable sort, so equal
    arrivals keep the file's order)."""
    import io

    import pandas as pd

    from ..base.checks import MAX_CONFIG_SIZE, MAX_SIM_S, MAX_TRACE_BYTES, MAX_TRACE_ROWS, read_bounded

    p = Path(path)
    require(p.is_file(), f"trace file not found: {p}")
    # rows and bytes counted while the file streams in: a trace past either bound is
    # refused when it is crossed, before the rest is read
    data = read_bounded(p, f"trace {p}", MAX_TRACE_BYTES, MAX_TRACE_ROWS)
    try:
        raw = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False)
    except Exception as exc:
        raise UserError(f"trace {p}: cannot read as CSV ({type(exc).__name__})") from None
    cols = ["arrival_s", "input_tokens", "output_tokens"]
    named = {c: c for c in cols}  # pipesim's column -> the file's, for the messages
    if not set(cols) & set(raw.columns) and set(VIDUR_COLUMNS) & set(raw.columns):
        named = {ours: theirs for theirs, ours in VIDUR_COLUMNS.items()}
        missing = [c for c in VIDUR_COLUMNS if c not in raw.columns]
        require(
            not missing,
            f"trace {p}: missing Vidur column(s) {', '.join(missing)}; needed: {', '.join(VIDUR_COLUMNS)} "
            "(pipesim replays arrivals: a trace without arrived_at has none)",
        )
        raw = raw.rename(columns=VIDUR_COLUMNS)
    missing = [c for c in cols if c not in raw.columns]
    require(
        not missing,
        f"trace {p}: missing column(s) {', '.join(missing)}; needed: {', '.join(cols)} "
        f"(or Vidur's {', '.join(VIDUR_COLUMNS)})",
    )
    require(
        len(raw) <= MAX_TRACE_ROWS,
        f"trace {p} has {len(raw)} rows, above the limit of {MAX_TRACE_ROWS}; split it or replay a part of it",
    )
    df = pd.DataFrame({c: pd.to_numeric(raw[c].str.strip(), errors="coerce") for c in cols})
    for c in cols:
        v = df[c]
        if c == "arrival_s":
            bad, allowed = ~np.isfinite(v) | (v < 0), "finite seconds >= 0"
        else:
            bad = ~np.isfinite(v) | (v < 1) | (v > MAX_CONFIG_SIZE) | (v != v.round())
            allowed = f"whole tokens from 1 to {MAX_CONFIG_SIZE}"
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(
                f"trace {p}: line {row + 2}, column {named[c]}: {raw[c].iloc[row]!r} is not allowed ({allowed})"
            )
    require(len(df) >= 1, f"trace {p} has no requests")
    late = df.arrival_s > MAX_SIM_S
    if late.any():
        row = int(late.to_numpy().nonzero()[0][0])
        raise UserError(
            f"trace {p}: line {row + 2}: {named['arrival_s']} {raw.arrival_s.iloc[row]} is past the simulated horizon of "
            f"{MAX_SIM_S:g} s; shift the arrivals to start near 0"
        )
    df = df.sort_values("arrival_s", kind="stable")
    if num_requests:
        require(
            num_requests <= len(df),
            f"--num-requests {num_requests} asks for more than the trace's {len(df)} rows",
        )
        df = df.head(num_requests)
    rows = tuple((float(a), int(i), int(o)) for a, i, o in df[cols].itertuples(index=False))
    lens_in = Lengths(int(df.input_tokens.min()), int(df.input_tokens.max()))
    lens_out = Lengths(int(df.output_tokens.min()), int(df.output_tokens.max()))
    return Workload(
        "trace", lens_in, lens_out, trace=rows, trace_path=str(p), num_requests=len(rows), seed=seed
    )

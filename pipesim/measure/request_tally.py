"""What a run's finished requests measured, taken as each one finishes.

A closed loop keeps a row per measured request (plain columns of numbers, not the
request objects): its confidence interval (steady.py) and the workload part of its
band (uncertainty.py) read them in completion order, and its stopping rule bounds
their number (runner.py: at most 20 times the minimum). An open loop or a trace folds
each request into running figures instead: counts, means, the TTFT and TPOT
percentiles (sketch.Percentiles: exact up to EXACT_VALUES requests, within 0.5% past
that), the saturation (saturation.SaturationTally) and, an open loop, the same figures
of each stretch of its arrivals (stretches.StretchTally: its band's workload part).
It keeps rows only when asked (record="full"), so its memory does not grow with the
number of requests.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np

from .saturation import Saturation, SaturationTally
from .sketch import Percentiles
from .stretches import StretchTally

if TYPE_CHECKING:
    from ..engines.batches import Request

# a measured request's row, as the run records it (metrics.REQUEST_COLUMNS adds what
# follows from them)
ROW_COLUMNS = (
    "rid",
    "client",
    "arrival_s",
    "admit_s",
    "input_len",
    "output_len",
    "first_token_s",
    "finish_s",
    "slot",
)
INT_COLUMNS = frozenset({"rid", "client", "input_len", "output_len", "slot"})


class RequestTally:
    """A run's finished requests: rows (closed loops; any run with `keep_rows`) and,
    for an open loop or a trace, running figures. `arrivals_s`: an open loop's first
    and last arrival, known before the run (its saturation needs them); `requests`: the
    requests an open loop will measure (its stretches are cut by them; 0: none)."""

    def __init__(
        self,
        *,
        closed: bool,
        keep_rows: bool = False,
        arrivals_s: tuple[float, float] | None = None,
        requests: int = 0,
    ) -> None:
        self.closed = closed
        self.keep_rows = closed or keep_rows
        self._rows = (
            {c: array("q" if c in INT_COLUMNS else "d") for c in ROW_COLUMNS} if self.keep_rows else None
        )
        self.finished = 0  # every finished request, warm-up included
        self.measured = 0  # those in the measurement window
        # an open loop's running figures (milliseconds, tok/s)
        self.ttft_ms, self.tpot_ms, self.e2e_ms = Percentiles(), Percentiles(), Percentiles()
        self.decode_tok_s = Percentiles()
        self._saturation = SaturationTally(*arrivals_s) if arrivals_s is not None else None
        self.stretches = StretchTally(requests) if requests else None

    def arrival(self, t_s: float) -> None:
        if self._saturation is not None:
            self._saturation.arrival(t_s)

    def first_token(self, t_s: float) -> None:
        if self._saturation is not None:
            self._saturation.first_token(t_s)

    def finish(self, r: Request, measured: bool) -> None:
        """Take a request that has just finished (`measured`: in the window)."""
        self.finished += 1
        if self._saturation is not None:
            self._saturation.finish(r.finish_s)
        if not measured:
            return
        self.measured += 1
        if self._rows is not None:
            for c, col in self._rows.items():
                col.append(getattr(r, c))
        if self.closed:
            return
        first, finish, out = r.first_token_s, r.finish_s, r.output_len
        ttft_ms = (first - r.arrival_s) * 1e3
        self.ttft_ms.add(ttft_ms)
        self.e2e_ms.add((finish - r.arrival_s) * 1e3)
        tpot_ms = speed = None
        if out > 1:
            decode_s = finish - first
            tpot_ms = decode_s / (out - 1) * 1e3
            self.tpot_ms.add(tpot_ms)
            if decode_s > 0:
                speed = (out - 1) / decode_s
                self.decode_tok_s.add(speed)
        if self.stretches is not None:
            self.stretches.add(r.rid, r.arrival_s, ttft_ms, tpot_ms, speed, out)

    def rows(self) -> dict[str, np.ndarray] | None:
        """The measured requests' rows in completion order (None: not kept)."""
        if self._rows is None:
            return None
        return {
            c: np.frombuffer(col, dtype=np.int64 if c in INT_COLUMNS else float)
            for c, col in self._rows.items()
        }

    def closed_loop_sample(self, queued: bool) -> tuple[np.ndarray, np.ndarray]:
        """(output tokens, latency seconds) of the measured requests in completion order:
        a closed loop's batch means (steady.py). `queued`: latency from admission."""
        rows = self._rows
        assert rows is not None, "a closed loop keeps its rows"
        start = rows["admit_s"] if queued else rows["arrival_s"]
        out = np.frombuffer(rows["output_len"], dtype=np.int64).astype(float)
        return out, np.frombuffer(rows["finish_s"]) - np.frombuffer(start)

    def saturation(self) -> Saturation | None:
        return None if self._saturation is None else self._saturation.result()

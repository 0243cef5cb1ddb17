"""Read nccl-tests output (all_reduce_perf, all_gather_perf, sendrecv_perf, ...).

The text format (NVIDIA/nccl-tests, src/common.cu): comment lines start with '#';
each data row is

    size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong

out-of-place, then in-place; `size` in bytes, `time` in microseconds (host wall clock,
average per operation after warm-up). Older versions lack the `root` column and
`#wrong` can be N/A. The out-of-place time is taken (what engines run).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from ...base.checks import MAX_TEXT_BYTES, read_bounded
from ...base.errors import UserError, require

if TYPE_CHECKING:
    from ..profile import Profile
    from ..writing import Edit

OPS = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "alltoall": "alltoall",
    "sendrecv": "sendrecv",
}


def detect_op(text: str, filename: str = "") -> str | None:
    for source in (text[:4000], filename):
        m = re.search(
            r"(all_?reduce|all_?gather|reduce_?scatter|alltoall|sendrecv)(_perf)?", source, re.IGNORECASE
        )
        if m:
            return OPS[m.group(1).lower()]
    return None


def count_gpus(text: str) -> int | None:
    ranks = re.findall(r"^#\s+Rank\s+\d+", text, flags=re.MULTILINE)
    if ranks:
        return len(ranks)
    m = re.search(r"nGpus\s+(\d+)", text)
    return int(m.group(1)) if m else None


def parse(text: str, origin: str, op: str | None = None, gpus: int | None = None) -> pd.DataFrame:
    """Rows (op, impl, gpus, nbytes, latency_ms) from one nccl-tests run."""
    op = op or detect_op(text, origin)
    require(
        op is not None,
        f"{origin}: cannot tell which collective this is; pass --op ({', '.join(sorted(set(OPS.values())))})",
    )
    require(op in OPS.values(), f"--op {op} is not one of {', '.join(sorted(set(OPS.values())))}")
    gpus = gpus or count_gpus(text)
    require(
        gpus is not None and gpus >= 2, f"{origin}: cannot tell how many GPUs ran; pass --gpus N (N >= 2)"
    )
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split()
        if len(parts) not in (12, 13):
            if parts[0].isdigit():
                raise UserError(
                    f"{origin}: line {n}: expected 12 or 13 columns "
                    f"(size count type redop [root] time algbw busbw #wrong x2), got {len(parts)}"
                )
            continue  # a trailer such as 'Out of bounds values : 0 OK'
        try:
            nbytes = int(parts[0])
            time_us = float(parts[-8])
        except ValueError:
            raise UserError(
                f"{origin}: line {n}: size must be whole bytes and time a number of microseconds"
            ) from None
        require(nbytes > 0 and time_us > 0, f"{origin}: line {n}: size and time must be > 0")
        rows.append((op, "nccl", gpus, nbytes, time_us / 1000.0))
    require(rows, f"{origin}: no data rows found (is this nccl-tests output?)")
    df = pd.DataFrame(rows, columns=["op", "impl", "gpus", "nbytes", "latency_ms"])
    return df.groupby(["op", "impl", "gpus", "nbytes"], as_index=False)["latency_ms"].mean()


def merge(old: pd.DataFrame | None, rows: pd.DataFrame) -> pd.DataFrame:
    """A collectives table with `rows` in place of the old rows of the same (op, impl,
    gpus) groups; every other group kept; sorted by key."""
    keep = old
    if old is not None:
        key = set(zip(rows.op, rows.impl, rows.gpus))
        keep = old[[k not in key for k in zip(old.op, old.impl, old.gpus)]]
    merged = pd.concat([keep, rows]) if keep is not None else rows
    return merged.sort_values(["op", "impl", "gpus", "nbytes"]).reset_index(drop=True)


def import_file(
    file: str | Path,
    profile_dir: str | Path,
    out: str | Path | None = None,
    *,
    op: str | None = None,
    gpus: int | None = None,
) -> pd.DataFrame:
    """Add one nccl-tests run to a profile's collectives table (in place unless `out`);
    returns the rows read."""
    from ...base.checks import MAX_GPUS, whole
    from ..writing import check_profile_out, rewrite_profile

    check_profile_out(profile_dir if out is None else out)
    if gpus is not None:
        gpus = whole(gpus, "--gpus", 1, MAX_GPUS)
    require(Path(file).is_file(), f"nccl-tests output not found: {file}")
    text = read_bounded(file, str(file), MAX_TEXT_BYTES).decode(errors="replace")
    rows = parse(text, str(file), op, gpus)

    def edit(prof: Profile) -> Edit:
        """The rows merged into the table as it is when the profile's lock is held."""
        merged = merge(prof.tables.get("collectives"), rows)
        note = f"{prof.sources.get('collectives', '')}; nccl-tests {Path(file).name}".strip("; ")
        return {
            "tables": {"collectives": merged},
            "meta_update": {"sources": {**prof.sources, "collectives": note}},
        }

    rewrite_profile(profile_dir, out, edit=edit)
    return rows

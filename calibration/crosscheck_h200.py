"""Cross-check a live H200 profile against AIConfigurator's H200 tables at the same shapes.

    python calibration/crosscheck_h200.py PROFILE_DIR [../shared/reference-data/aiconfigurator/h200_sxm]
        [--csv out.csv] [--summary-only]

For every row of the measured profile's gemm (bf16), attention and MoE tables, the
AIConfigurator latency at the same shape: exact where AIConfigurator measured that
shape, else interpolated in its tables the way the cost model interpolates (between
measured sizes only: a shape outside AIConfigurator's grid is left out, not
extrapolated). Prints one line per shape (op class, shape, measured ms,
AIConfigurator ms, ratio measured / AIConfigurator, exact or interpolated) and a
summary per op class (median and geometric-mean ratio).

AIConfigurator's tables are SGLang 0.5.14's kernels (cuBLAS GEMMs, FlashInfer / FA3
attention, fused Triton MoE); the live profile times plain torch (cuBLAS, torch SDPA,
grouped GEMM). Ratios away from 1 measure that kernel gap, not a timing error.
AIConfigurator's decode `step` is read as the context length.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import pandas as pd

from pipesim.profiles import profile as profile_mod
from pipesim.profiles.curves import bracket
from pipesim.profiles.importers.aiconfigurator import build_tables
from pipesim.profiles.profile import load_profile
from pipesim.profiles.tables import TABLE_COLUMNS

DEFAULT_AIC = (
    Path(__file__).resolve().parent.parent.parent
    / "shared"
    / "reference-data"
    / "aiconfigurator"
    / "h200_sxm"
)
OP_TABLES = ("gemm", "gqa_decode", "gqa_prefill", "mla_decode", "mla_prefill", "moe")


def _inside(grid, x) -> bool:
    return grid[0] <= x <= grid[-1]


def _curve_at(curve, x):
    """(value, exact) inside the curve's range, else None."""
    if not _inside(curve.xs, x):
        return None
    return curve(x), x in curve.xs


def _surface_at(surface, a, b):
    """A Surface (outer a bracketed, inner b interpolated) at (a, b), inside its grid only."""
    if not _inside(surface.keys, a):
        return None
    total, exact = 0.0, True
    for i, w in bracket(surface.keys, a):
        hit = _curve_at(surface.rows[i], b)
        if hit is None:
            return None
        total += w * hit[0]
        exact = exact and hit[1] and surface.keys[i] == a
    return total, exact


def _gemm_at(gemm, m, n, k):
    ns, ks, curves = gemm
    if not (_inside(ns, n) and _inside(ks, k)):
        return None
    total, exact = 0.0, True
    for i, wn in bracket(ns, n):
        for j, wk in bracket(ks, k):
            curve = curves.get((ns[i], ks[j]))
            hit = None if curve is None else _curve_at(curve, m)
            if hit is None:
                return None
            total += wn * wk * hit[0]
            exact = exact and hit[1] and ns[i] == n and ks[j] == k
    return total, exact


def reference_profile(aic_dir: Path):
    """AIConfigurator's H200 tables (SGLang kernels) as a pipesim Profile, for its lookups."""
    tables = build_tables(aic_dir, kernel_set="sglang")
    tables_cls = getattr(profile_mod, "Tables", dict)
    return profile_mod.Profile(
        "aiconfigurator-h200", "h200-1x", "sglang", "0.5.14", profile_mod.Params(), {}, tables_cls(tables)
    )


def compare(measured, reference) -> pd.DataFrame:
    """One row per measured shape that AIConfigurator covers."""
    rows = []
    for table in OP_TABLES:
        df = measured.tables.get(table)
        if df is None:
            continue
        cols = TABLE_COLUMNS[table]
        for rec in df.itertuples(index=False):
            key = dict(zip(cols, rec[:-1]))
            ms = float(rec[-1])
            if table == "gemm":
                if key["dtype"] not in reference.gemm:
                    continue
                hit = _gemm_at(reference.gemm[key["dtype"]], key["m"], key["n"], key["k"])
                shape = f"m={key['m']} n={key['n']} k={key['k']}"
            elif table == "moe":
                curve = reference.moe.get(
                    (
                        key["dtype"],
                        key["hidden"],
                        key["inter"],
                        key["topk"],
                        key["experts"],
                        key["moe_tp"],
                        key["distribution"],
                    )
                )
                hit = None if curve is None else _curve_at(curve, key["tokens"])
                shape = (
                    f"h={key['hidden']} i={key['inter']} top{key['topk']}/{key['experts']} tp{key['moe_tp']} "
                    f"{key['distribution']} tokens={key['tokens']}"
                )
            else:
                lookup = getattr(reference, table)
                inner = "context" if table.endswith("decode") else "isl"
                head_key = tuple(key[c] for c in cols if c not in ("batch", inner))
                surface = lookup.get(head_key)
                hit = None if surface is None else _surface_at(surface, key["batch"], key[inner])
                shape = " ".join(f"{c}={key[c]}" for c in cols)
            if hit is None:
                continue
            ref_ms, exact = hit
            rows.append(
                {
                    "op": table,
                    "shape": shape,
                    "measured_ms": ms,
                    "aic_ms": ref_ms,
                    "ratio": ms / ref_ms if ref_ms > 0 else math.nan,
                    "match": "exact" if exact else "interp",
                }
            )
    return pd.DataFrame(rows, columns=["op", "shape", "measured_ms", "aic_ms", "ratio", "match"])


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    out = []
    for op, part in rows.groupby("op", sort=False):
        r = [x for x in part["ratio"] if x > 0 and math.isfinite(x)]
        if not r:
            continue
        out.append(
            {
                "op": op,
                "shapes": len(r),
                "exact": int((part["match"] == "exact").sum()),
                "median_ratio": statistics.median(r),
                "geomean_ratio": math.exp(statistics.mean(map(math.log, r))),
                "min_ratio": min(r),
                "max_ratio": max(r),
            }
        )
    return pd.DataFrame(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", help="profile directory written by pipesim calibrate live on an H200")
    ap.add_argument("aic", nargs="?", default=str(DEFAULT_AIC), help="AIConfigurator h200_sxm folder")
    ap.add_argument("--csv", default=None, help="also write every compared shape to this CSV")
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args(argv)
    measured = load_profile(args.profile)
    rows = compare(measured, reference_profile(Path(args.aic)))
    if rows.empty:
        print("no shape of the profile is inside AIConfigurator's tables")
        return 1
    pd.set_option("display.width", 200)
    if not args.summary_only:
        print(rows.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print()
    print(
        f"measured {measured.meta.get('gpu', {}).get('name', '?')} ({args.profile}) / AIConfigurator h200_sxm "
        "(SGLang 0.5.14 kernels); ratio > 1: the live measurement is slower"
    )
    print(summary(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.csv:
        rows.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

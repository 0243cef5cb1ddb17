"""Fit the corpus residuals of predictions (pipesim/data/residuals.json).

    python calibration/validate_corpus.py --rows-json rows.json   # the compared numbers (both paths)
    python calibration/fit_residuals.py --rows rows.json [--host-folds folds.json]
        # writes the fit and docs/residuals.md

Two fits: the roofline path's numbers (every cost unmeasured: what the band of an
unmeasured share stands for) and the user path's numbers by profiles with no measured
point of their own (AIConfigurator's tables with the host loop's defaults: what the
band of such a profile's measured share stands for). pipesim.calibrate.residuals says
what is fitted and how; docs/uncertainty.md how a band uses it. The report gives every
group's quantiles (the median corrects a headline, the 10% and 90% quantiles are its
band's edges), the corrected headline's error with the medians fitted without the
number's own source and publisher, and the coverage leave one source and one publisher
out (each against a band fitted to the others), the honest figures for a band fitted on
the corpus it is checked on. `--host-folds` (calibration/fit_host_loop.py --rows-out)
adds the coverage on each publisher held out of the host loop's fit too: its numbers
predicted with the host loop fitted without it, against a band fitted on the other
publishers' numbers at those values. Rerun validate_corpus.py afterwards: its bands use
the fit.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipesim.calibrate import residuals as R

HERE = Path(__file__).resolve().parent


def pooled(df: pd.DataFrame) -> float:
    return df.inside.sum() / df.numbers.sum() if len(df) else float("nan")


def quantile_table(res: dict, r: pd.DataFrame) -> list[str]:
    lines = [
        "| group | numbers | runs | 10% quantile | median | 90% quantile | measured / predicted, 10%-90% |",
        "|---|---|---|---|---|---|---|",
    ]
    for group, g in r.groupby("group"):
        if group not in res:
            lines.append(
                f"| {group} | {len(g)} | {g.run_id.nunique()} | - | - | - | too few numbers: not fitted |"
            )
            continue
        v = res[group]
        lines.append(
            f"| {group} | {v.numbers} | {g.run_id.nunique()} | {v.q_lo:+.3f} | {v.q_mid:+.3f} | {v.q_hi:+.3f} | "
            f"{math.exp(v.q_lo):.2f}x-{math.exp(v.q_hi):.2f}x |"
        )
    return lines


def error_table(rows: pd.DataFrame, roof: pd.DataFrame) -> list[str]:
    """Median / mean |error| and median signed error per metric: simulated, and corrected
    with the medians fitted leave one source and one publisher out."""
    lines = [
        "| metric | numbers | simulated | corrected, leave one source out | corrected, leave one publisher out |",
        "|---|---|---|---|---|",
    ]
    cs, cp = R.corrected_error(rows, roof=roof), R.corrected_error(rows, by="publisher", roof=roof)

    def cell(e: pd.Series) -> str:
        return f"{e.abs().median():.1f} / {e.abs().mean():.1f} / {e.median():+.1f}"

    for metric, g in [*rows.groupby("metric"), ("all", rows)]:
        a = cs.error_pct if metric == "all" else cs[cs.metric == metric].error_pct
        b = cp.error_pct if metric == "all" else cp[cp.metric == metric].error_pct
        lines.append(f"| {metric} | {len(g)} | {cell(g.error_pct)} | {cell(a)} | {cell(b)} |")
    return lines


def coverage_table(rows: pd.DataFrame, res: dict, tab: dict, roof: pd.DataFrame) -> list[str]:
    lo, lp = R.loso(rows, roof=roof), R.loso(rows, by="publisher", roof=roof)
    insample = R.inside(rows, res, tab)
    lines = [
        f"- in sample (the band fitted on every source): {insample.mean():.0%} of {len(rows)} numbers",
        f"- **leave one source out** (each source against a band fitted to the others): {pooled(lo):.0%}",
        f"- **leave one publisher out** (each publisher against a band fitted to the others): {pooled(lp):.0%}",
        "",
        "| held out | numbers | inside | coverage |",
        "|---|---|---|---|",
    ]
    for x in [*lo.itertuples(), *lp[lp.held_out == "gpustack-perflab"].itertuples()]:
        lines.append(f"| {x.held_out} | {x.numbers} | {x.inside} | {x.coverage:.0%} |")
    return lines


def host_fold_table(folds: dict, roof: pd.DataFrame) -> list[str]:
    """Coverage on each publisher held out of the host loop's fit and of the band's."""
    lines = [
        "| held out | numbers | inside | coverage | median / mean / signed error, simulated | corrected |",
        "|---|---|---|---|---|---|",
    ]
    total = inside_all = 0
    for pub, f in folds.items():
        train, held = pd.DataFrame(f["train"]), pd.DataFrame(f["held"])
        res = R.fit(roof[roof.source_id.map(R.publisher) != pub])
        tab = R.fit(train, "tables")
        ok = R.inside(held, res, tab)
        total, inside_all = total + len(held), inside_all + int(ok.sum())
        c = [
            R.band_log(r.family, r.calibration_rel, r.unmeasured_share, (), res, R._tables_of(r, tab))[0]
            for r in held.itertuples()
        ]
        corr = (held.predicted * np.exp(c) / held.measured - 1) * 100
        e = held.error_pct
        lines.append(
            f"| {pub} | {len(held)} | {int(ok.sum())} | {ok.mean():.0%} | "
            f"{e.abs().median():.1f} / {e.abs().mean():.1f} / {e.median():+.1f} | "
            f"{corr.abs().median():.1f} / {corr.abs().mean():.1f} / {corr.median():+.1f} |"
        )
    lines.append(f"| all | {total} | {inside_all} | {inside_all / max(total, 1):.0%} | | |")
    return lines


def per_source(r: pd.DataFrame) -> list[str]:
    lines = ["| source | group | numbers | median measured / predicted | 10%-90% |", "|---|---|---|---|---|"]
    for (source, group), g in r.groupby(["source_id", "group"]):
        x, w = g.log_residual.to_numpy(float), g.weight.to_numpy(float)
        q = [math.exp(R.weighted_quantile(x, w, p)) for p in (R.Q_LO, 0.5, R.Q_HI)]
        lines.append(f"| {source} | {group} | {len(g)} | {q[1]:.2f}x | {q[0]:.2f}x-{q[2]:.2f}x |")
    return lines


def report(res: dict, roof: pd.DataFrame, tab: dict, user: pd.DataFrame, folds: dict | None = None) -> str:
    lines = [
        "# Corpus residuals of predictions",
        "",
        "Generated by `python calibration/fit_residuals.py` (do not edit by hand) from the compared numbers",
        "of `pipesim validate --corpus` (docs/validation.md). Method: `pipesim/calibrate/residuals.py`;",
        "how a band uses the fit: docs/uncertainty.md. Residual = log(measured / predicted) (for per-request",
        "tok/s, of its inverse, TPOT); each run weighted once per group. Two fits: the **roofline** path's",
        f"numbers whose prediction had at least {R.MIN_SHARE:.0%} of its stage time unmeasured (the band of an",
        "unmeasured share), and the **user** path's numbers by a profile with no measured point of its own",
        "(AIConfigurator's tables with the host loop's defaults: the band of such a profile's measured share).",
        "Publishers: GPUStack's performance-lab pages are one (one lab, one method); every other source is its",
        "own.",
        "",
        "## Unmeasured costs: the roofline path (pipesim/data/residuals.json `groups`)",
        "",
        *quantile_table(res, R.residual_rows(roof)),
        "",
        "A headline priced by the roofline on a share u of its stage time is printed corrected by e^(u x median)",
        "(docs/uncertainty.md). Its error against the corpus, the median fitted without the number's own source",
        "(leave one source out) and publisher, beside the simulated prediction's; median / mean |error| / median",
        "signed error in %:",
        "",
        *error_table(roof, roof),
        "",
        "Coverage of the 80% band, roofline path:",
        "",
        *coverage_table(roof, res, {}, roof),
        "",
        "## Measured tables off their own box: the user path (`table_groups`)",
        "",
        *quantile_table(tab, R.residual_rows(user, "tables")),
        "",
        "A catalogue profile's headline is printed corrected by e^((1 - u) x this median + u x the roofline's).",
        "Its error, as above:",
        "",
        *error_table(user, roof),
        "",
        "Coverage of the 80% band, user path (the tables' part fitted on the others' user-path numbers, the",
        "roofline part on the others' roofline-path numbers):",
        "",
        *coverage_table(user, res, tab, roof),
    ]
    if folds:
        lines += [
            "",
            "## Held out of the host loop's fit as well",
            "",
            "Each publisher's numbers predicted with the host loop fitted without it (calibration/fit_host_loop.py,",
            "docs/host-fit.md), against a band whose tables' part is fitted on the other publishers' numbers at",
            "those values (the roofline part on their roofline-path numbers): the band's coverage on data neither",
            "the host loop nor the band saw. Errors: median / mean |error| / median signed, in %.",
            "",
            *host_fold_table(folds, roof),
        ]
    lines += [
        "",
        "## Residuals per source",
        "",
        "Roofline path:",
        "",
        *per_source(R.residual_rows(roof)),
        "",
        "User path (profiles with no measured point of their own):",
        "",
        *per_source(R.residual_rows(user, "tables")),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, required=True, help="validate_corpus.py --rows-json output")
    ap.add_argument("--out", type=Path, default=HERE.parent / "pipesim" / "data" / "residuals.json")
    ap.add_argument("--report", type=Path, default=HERE.parent / "docs" / "residuals.md")
    ap.add_argument("--host-folds", type=Path, default=None, help="calibration/fit_host_loop.py --rows-out")
    args = ap.parse_args()
    data = json.loads(args.rows.read_text())
    roof = pd.DataFrame(data.get("roofline_rows") or data["rows"])  # the roofline path's numbers
    user = pd.DataFrame(data["rows"])  # the user path's
    res, tab = R.fit(roof), R.fit(user, "tables")
    folds = json.loads(args.host_folds.read_text())["folds"] if args.host_folds else None
    args.out.write_text(json.dumps(R.to_json(res, roof, tab, user), indent=2) + "\n")
    text = report(res, roof, tab, user, folds)
    args.report.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

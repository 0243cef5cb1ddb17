"""Calibrate NCCL's collective model (pipesim/costs/collectives.py) on measured fabrics,
and validate it leave-one-box-out.

    python calibration/fit_collectives.py   # writes pipesim/data/collective_fit.json and docs/collectives.md

Data: AIConfigurator's measured NCCL tables (aiconfigurator-core, Apache-2.0,
`pipesim[catalogue]`: nccl_perf, NCCL 2.27-2.29, half precision), read by pipesim's own
importer (profiles/importers/aiconfigurator.py: the sizes and units a profile uses) for
every 8-GPU box preset that names its `aiconfigurator_system`; the box preset gives the
links the model reads (the same numbers a prediction for that box uses).

Per fabric class (`nvlink`, `pcie`: collectives.fabric_kind) two numbers for all-reduce,
all-gather and reduce-scatter (a scale on NCCL's latency constants, the share of the
ring's narrowest link NCCL's bus bandwidth reaches) and two for the all-to-all (its
latency, its link share) are fitted by least squares on log(predicted / measured), every
box of the class weighted alike. Then every box is predicted by the fit of its class's
other boxes: the leave-one-box-out error per collective and message-size band, beside
the ring formula pipesim used before (6.6 us + 1 us per step + bytes over the link).
The split of every measured curve into its latency and bandwidth parts (collectives.
split_fit, what a bandwidth what-if rescales) is reported with its residuals.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from pipesim.costs.collectives import FIT_FILE, ClassFit, Fabric, fabric_of, nccl_time, ring_bw, split_fit
from pipesim.inputs.box import box_names, load_box
from pipesim.profiles.catalogue import data_root
from pipesim.profiles.importers.aiconfigurator import build_tables

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
BANDS = (
    (0, 64 * 1024, "< 64 KiB"),
    (64 * 1024, 4 * 2**20, "64 KiB - 4 MiB"),
    (4 * 2**20, math.inf, ">= 4 MiB"),
)
# Measured, reported, but not fitted (the reason is printed in the report).
EXCLUDED = {
    "l40s-8x": (
        "its 4- and 8-GPU tables are far below its links: all-reduce of 512 MiB at 4.9 and 1.5 GB/s bus "
        "bandwidth on 4 and 8 GPUs (2 GPUs: 19 GB/s) against PCIe Gen4 x16 P2P links of 32 GB/s; the measured "
        "box did not run P2P across its PCIe switches (a fault of that box, not of PCIe). Predicted from the "
        "fit of the others and reported; the l40s-8x preset sets this table aside "
        "(aiconfigurator_collectives_set_aside) and takes its collectives from the model on its links, "
        "its kernels still from the measured tables"
    )
}


def band(nbytes: float) -> str:
    return next(name for lo, hi, name in BANDS if lo <= nbytes < hi)


def load_rows() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(NCCL points of every measured 8-GPU box, every measured curve incl. the custom
    all-reduce), one row per (box, op, impl, gpus, nbytes)."""
    root = data_root()
    if root is None:
        raise SystemExit("aiconfigurator-core is not installed: pip install 'pipesim[catalogue]'")
    rows = []
    for name in box_names():
        box = load_box(name)
        system = box.aiconfigurator_system
        if not system or box.gpu_count < 8 or not (root / system / "comm" / "nccl").is_dir():
            continue
        versions: dict = {}
        table = build_tables(root / system, kernel_set="sglang", versions=versions).get("collectives")
        if table is None:
            continue
        for r in table.itertuples():
            gpus = tuple(range(int(r.gpus)))
            fab = fabric_of(box, gpus, ring_bw(box, gpus))
            rows.append(
                {
                    "box": name,
                    "system": system,
                    "source": versions.get("collectives", ""),
                    "kind": fab.kind,
                    "generation": fab.generation,
                    "bus_bw": fab.bus_bw_bytes_s,
                    "op": r.op,
                    "impl": r.impl,
                    "n": int(r.gpus),
                    "nbytes": float(r.nbytes),
                    "t": float(r.latency_ms) * 1e-3,
                }
            )
    df = pd.DataFrame(rows)
    return df[df.impl == "nccl"].reset_index(drop=True), df


def predict(d: pd.DataFrame, fit: ClassFit) -> tuple[np.ndarray, list[str]]:
    out, labels = [], []
    for r in d.itertuples():
        fab = Fabric(r.kind, r.kind == "nvlink", r.generation, r.bus_bw)
        t, label = nccl_time(r.op, r.n, r.nbytes, fab, fit)
        out.append(t)
        labels.append(label)
    return np.array(out), labels


def old_ring(d: pd.DataFrame) -> np.ndarray:
    """The formula pipesim used before: 6.6 us + 1 us per ring step + bytes over the link."""
    steps = np.where(d.op == "all_reduce", 2 * (d.n - 1), d.n - 1)
    frac = np.where(d.op == "all_reduce", 2 * (d.n - 1) / d.n, (d.n - 1) / d.n)
    return 6.6e-6 + steps * 1e-6 + frac * d.nbytes / d.bus_bw


def fit_class(d: pd.DataFrame) -> ClassFit:
    """Least squares on log(predicted / measured), each box weighted alike."""
    w = 1.0 / d.groupby("box").box.transform("size").to_numpy(float)

    def solve(part: pd.DataFrame, weights: np.ndarray, make, x0, lo, hi):
        meas = part.t.to_numpy()

        def res(x):
            return np.sqrt(weights) * np.log(predict(part, make(x))[0] / meas)

        return least_squares(res, x0, bounds=(lo, hi)).x

    coll = d.op != "alltoall"
    lat, eff = solve(
        d[coll], w[coll.to_numpy()], lambda x: ClassFit(x[0], x[1]), [1.0, 0.7], [0.2, 0.05], [5, 1.5]
    )
    a2a = ~coll
    a_lat, a_eff = solve(
        d[a2a], w[a2a.to_numpy()], lambda x: ClassFit(1, 1, x[0], x[1]), [8.4, 0.7], [0.5, 0.05], [100, 1.5]
    )
    return ClassFit(float(lat), float(eff), float(a_lat), float(a_eff))


def errors(d: pd.DataFrame, pred: np.ndarray) -> pd.DataFrame:
    return d.assign(
        pred=pred,
        err=np.abs(pred / d.t.to_numpy() - 1) * 100,
        ratio=pred / d.t.to_numpy(),
        band=[band(b) for b in d.nbytes],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "pipesim" / "data" / FIT_FILE)
    ap.add_argument("--report", type=Path, default=REPO / "docs" / "collectives.md")
    args = ap.parse_args()
    nccl, curves = load_rows()
    fits, lobo, notes = {}, [], {}
    for kind, d in nccl.groupby("kind"):
        fitted_on = d[~d.box.isin(list(EXCLUDED))]
        fits[kind] = (fit_class(fitted_on), sorted(fitted_on.box.unique()))
        for held in sorted(d.box.unique()):
            others = fitted_on[fitted_on.box != held]
            if others.empty:  # the class's only fitted box: predicted from the excluded ones
                others = d[d.box != held]
                notes[held] = f"fitted on {', '.join(sorted(others.box.unique()))} (the class's other boxes)"
            else:
                notes[held] = f"fitted on {', '.join(sorted(others.box.unique()))}"
            part = d[d.box == held]
            fit = fit_class(others)
            pred, labels = predict(part, fit)
            lobo.append(errors(part, pred).assign(old=old_ring(part), label=labels))
    lobo = pd.concat(lobo, ignore_index=True)
    lobo["old_err"] = np.abs(lobo.old / lobo.t - 1) * 100
    data = {
        "source": (
            "fitted by calibration/fit_collectives.py on AIConfigurator's measured NCCL tables (aiconfigurator-core, "
            "Apache-2.0) of " + ", ".join(sorted(nccl.system.unique())) + "; docs/collectives.md"
        ),
        "nccl_model": "NCCL v2.29.2-1 src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime)",
        "classes": {
            k: {
                "latency_scale": round(f.latency_scale, 4),
                "bus_eff": round(f.bus_eff, 4),
                "a2a_latency_us": round(f.a2a_latency_us, 3),
                "a2a_eff": round(f.a2a_eff, 4),
                "fitted_on": boxes,
            }
            for k, (f, boxes) in sorted(fits.items())
        },
    }
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    text = report(nccl, curves, fits, lobo, notes)
    args.report.write_text(text)
    print(text)


def _pct(x: pd.Series) -> str:
    return f"{x.median():.1f} / {x.mean():.1f}"


def report(nccl, curves, fits, lobo, notes) -> str:
    lines = [
        "# Collectives: NCCL's model calibrated, and measured tables split",
        "",
        "Generated by `python calibration/fit_collectives.py` (do not edit by hand); the numbers it fits are",
        "`pipesim/data/collective_fit.json`, read by `pipesim/costs/collectives.py` (its docstring states the model).",
        "",
        "A collective is priced from the profile's measured table where one exists, its bandwidth part moved to",
        "the box's own links (below); elsewhere by NCCL's own algorithm and protocol choice and its",
        "latency / bandwidth formula (NCCL v2.29.2-1, `src/graph/tuning.cc`), with two numbers per fabric class",
        "calibrated here. Data: AIConfigurator's measured `nccl_perf` tables (half precision, 2, 4 and 8 GPUs of",
        "one box; sizes are the whole buffer: an all-gather's output, a reduce-scatter's input, an all-to-all's",
        "per-rank buffer) of the box presets below.",
        "",
        "## Measured boxes",
        "",
        "| box | AIConfigurator system | NCCL table | fabric | ring's narrowest link (8 GPUs) | points |",
        "|---|---|---|---|---|---|",
    ]
    for box, g in nccl.groupby("box"):
        r = g.iloc[0]
        bw8 = g[g.n == 8].bus_bw.iloc[0] / 1e9
        lines.append(f"| {box} | {r.system} | {r.source} | {r.kind} | {bw8:.0f} GB/s | {len(g)} |")
    lines += ["", "## The fit (pipesim/data/collective_fit.json)", ""]
    lines += [
        "| class | fitted on | latency scale (x NCCL's) | bus bandwidth / link | all-to-all latency (us) | "
        "all-to-all bandwidth / link |",
        "|---|---|---|---|---|---|",
    ]
    for kind, (f, boxes) in sorted(fits.items()):
        lines.append(
            f"| {kind} | {', '.join(boxes)} | {f.latency_scale:.3f} | {f.bus_eff:.3f} | {f.a2a_latency_us:.2f} | "
            f"{f.a2a_eff:.3f} |"
        )
    for box, why in EXCLUDED.items():
        lines += ["", f"Not fitted: **{box}**: {why}."]
    lines += [
        "",
        "In sample (each class's fit on the boxes it was fitted on), median / mean |error| in %:",
        "",
    ]
    for kind, (f, boxes) in sorted(fits.items()):
        part = nccl[nccl.box.isin(boxes)]
        e = errors(part, predict(part, f)[0])
        lines.append(
            f"- {kind}: " + "; ".join(f"{op} {_pct(e[e.op == op].err)}" for op in OPS) + f" ({len(e)} points)"
        )
    lines += [
        "",
        "## Leave-one-box-out",
        "",
        "Each box predicted by the fit of its class's other boxes (the excluded box is held out too; a class's",
        "only fitted box is predicted from the excluded one). Median / mean |error| in %, and beside them the",
        "ring formula pipesim used before (6.6 us + 1 us per step + bytes over the ring's narrowest link).",
        "",
        "### By collective and message size, all held-out boxes",
        "",
        "| class | collective | size | points | NCCL model: median / mean abs % | median predicted / measured | "
        "old ring formula: median / mean abs % |",
        "|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, (_, _, name) in enumerate(BANDS)}
    for (kind, op, b), g in sorted(
        lobo.groupby(["kind", "op", "band"]), key=lambda kv: (kv[0][0], OPS.index(kv[0][1]), order[kv[0][2]])
    ):
        lines.append(
            f"| {kind} | {op} | {b} | {len(g)} | {_pct(g.err)} | {g.ratio.median():.2f} | {_pct(g.old_err)} |"
        )
    lines += [
        "",
        "### Per held-out box",
        "",
        "| held-out box | fitted on | collective | < 64 KiB | 64 KiB - 4 MiB | >= 4 MiB | all |",
        "|---|---|---|---|---|---|---|",
    ]
    for (box, op), g in sorted(lobo.groupby(["box", "op"]), key=lambda kv: (kv[0][0], OPS.index(kv[0][1]))):
        cells = [_pct(g[g.band == name].err) for _, _, name in BANDS]
        lines.append(f"| {box} | {notes[box]} | {op} | " + " | ".join(cells) + f" | {_pct(g.err)} |")
    lines += [
        "",
        "### What NCCL's model picks (held-out predictions, 8 GPUs)",
        "",
        "| box | collective | algorithm / protocol by size |",
        "|---|---|---|",
    ]
    for (box, op), g in lobo[(lobo.n == 8) & (lobo.op != "alltoall")].groupby(["box", "op"]):
        g = g.sort_values("nbytes")
        runs, last = [], None
        for r in g.itertuples():
            if r.label != last:
                runs.append(f"{r.label} from {_size(r.nbytes)}")
                last = r.label
        lines.append(f"| {box} | {op} | {'; '.join(runs)} |")
    lines += [
        "",
        "## Measured tables: latency and bandwidth parts",
        "",
        "Every measured curve (op, implementation, GPUs) is fitted as t = latency + bytes / bandwidth by least",
        "squares in relative error (`collectives.split_fit`). A prediction reads the table itself; the fit only",
        "says which part of a point is latency: what a point takes beyond the fitted latency is moved by a",
        "bandwidth what-if, t' = min(latency, t) + max(t - latency, 0) / k (k: the ring's narrowest link on the",
        "predicted box over the measured box's), and is tagged `scaled`. The residuals say how far a straight",
        "line is from the curve: the bumps are NCCL's protocol switches (LL -> LL128 -> Simple).",
        "",
        "| box | collective | impl | GPUs | latency (us) | bandwidth (GB/s) | median / max abs residual % |",
        "|---|---|---|---|---|---|---|",
    ]
    for (box, op, impl, n), g in curves.groupby(["box", "op", "impl", "n"]):
        s = split_fit(g.nbytes.tolist(), g.t.tolist())
        bw = f"{s.bw_bytes_s / 1e9:.1f}" if math.isfinite(s.bw_bytes_s) else "-"
        lines.append(
            f"| {box} | {op} | {impl} | {n} | {s.latency_s * 1e6:.1f} | {bw} | "
            f"{s.median_rel_err * 100:.1f} / {s.max_rel_err * 100:.1f} |"
        )
    lines += [
        "",
        "## What the model does not capture",
        "",
        "- One bus-bandwidth share per fabric class: what differs between boxes of a class beyond their link",
        "  bandwidth (PCIe root complexes, NCCL's channel count, NVLink generation) shows as a bias per box above.",
        "- NCCL's tuning constants are its model, not its measurement: where its choice of protocol differs from",
        "  the measured switch point, the mid-size band carries the error.",
        "- A box without P2P (its description says so) is priced with the PCIe class's numbers on the host-memory",
        "  bandwidth its preset states; no such box was measured.",
        "- Across nodes NCCL's ring with its network latencies (collectives.cross_node_time); not calibrated on",
        "  a measured multi-node table.",
    ]
    return "\n".join(lines) + "\n"


def _size(nbytes: float) -> str:
    for unit, div in (("MiB", 2**20), ("KiB", 1024)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{nbytes:g} B"


if __name__ == "__main__":
    main()

"""Which box? The same work on every shipped box, each priced the way a plain install
prices it, and the PCIe what-if on two PCIe boxes.

    python calibration/compare_boxes.py            # prints the two Markdown tables of docs/boxes.md
    python calibration/compare_boxes.py --quick    # fewer measured requests (a smoke run)

The work: Llama-3.1-70B (BF16) at TP8 with 32 clients, 1,024-token prompts and
256-token outputs, SGLang at its default release, on every 8-GPU box preset whose
GPUs hold it. For each box the table gives output throughput, the share of GPU stage time
spent in all-reduce (Result.allreduce_share), the headline a prediction prints (the
simulated figure corrected by the public corpus's median error of its pricing path:
report/uncertainty.corrected, docs/uncertainty.md), where its kernel and collective costs come
from (`pipesim boxes show`'s line: profiles/catalogue.table_source) and the largest
share of stage time by provenance (Result.provenance_shares). The second table runs
`--pcie-bandwidth-scale 0.5 / 1 / 2` on TP8 of the default box (its measured
collectives are split into latency and bandwidth parts, costs/collectives.split_fit, so
the bandwidth what-if moves them) and on the L40S box.
"""

from __future__ import annotations

import argparse

from pipesim import api
from pipesim.inputs.box import box_names, load_box
from pipesim.profiles.catalogue import choose

MODEL = "llama-3.1-70b"
WORK = dict(tp=8, conc=32, input_len=1024, output_len=256)
PCIE_BOXES = ("rtx-pro-6000-server-8x", "l40s-8x")
SCALES = (0.5, 1.0, 2.0)


def predict(box: str, quick: bool, intervals: bool = False, **what_if):
    extra = dict(measure_requests=64, max_measure_requests=64) if quick else {}
    return api.predict(model=MODEL, box=box, intervals=intervals, **WORK, **extra, **what_if)


def priced_by(box) -> str:
    """`pipesim boxes show`'s source line in a few words (profiles/catalogue.table_source)."""
    choice = choose(box, "sglang", MODEL)
    if choice.kind == "profile":
        return f"measured tables (shipped profile {choice.name})"
    if choice.kind == "roofline":
        die = f", curves of the {box.same_die_as} die" if box.same_die_as else ""
        return f"roofline{die}; NCCL model"
    collectives = "NCCL model (measured set aside)" if box.collectives_set_aside else "measured"
    return f"AIConfigurator {choice.name} kernels; collectives {collectives}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = []
    for name in box_names():
        box = load_box(name)
        if box.gpu_count != 8:
            continue
        try:
            r = predict(name, args.quick)
        except SystemExit:  # a box whose GPUs cannot hold the model: named by pipesim, skipped here
            continue
        headline = predict(name, args.quick, intervals=True).output_throughput_tok_s
        shares = r.provenance_shares or {"-": 1.0}
        top = max(shares, key=shares.get)
        rows.append(
            (r.output_throughput_tok_s, name, headline, r.allreduce_share, top, shares[top], priced_by(box))
        )
    print(f"{MODEL}, TP8, C = 32, 1,024 in / 256 out, SGLang\n")
    print("| box | simulated tok/s | headline tok/s | all-reduce share | most stage time | priced by |")
    print("|---|---|---|---|---|---|")
    for tok, name, head, ar, top, share, source in sorted(rows, reverse=True):
        print(f"| {name} | {tok:,.0f} | {head:,.0f} | {ar:.0%} | {top} {share:.0%} | {source} |")
    print("\n| box | " + " | ".join(f"PCIe x{s:g}" for s in SCALES) + " |")
    print("|---|" + "---|" * len(SCALES))
    for name in PCIE_BOXES:
        tok = [predict(name, args.quick, pcie_bandwidth_scale=s).output_throughput_tok_s for s in SCALES]
        print(f"| {name} | " + " | ".join(f"{t:,.1f}" for t in tok) + " |")


if __name__ == "__main__":
    main()

"""Collectives (pipesim/costs/collectives.py): NCCL's model against its published constants
(NCCL v2.29.2-1 src/graph/tuning.cc) worked by hand, the split of a measured table and the
bandwidth what-if against the raw table (physics.md §4), the fit file's physical bounds."""

import json
from dataclasses import replace
from importlib import resources

import pandas as pd
import pytest
from conftest import RAW_DIR

from pipesim.costs import collectives as C
from pipesim.costs.stage import CostModel
from pipesim.inputs.box import load_box
from pipesim.inputs.plan import make_plan
from pipesim.scenario.whatif import apply_box

FIT = json.loads((resources.files("pipesim.data") / C.FIT_FILE).read_text())["classes"]


def fit_of(kind):
    c = FIT[kind]
    return C.ClassFit(c["latency_scale"], c["bus_eff"], c["a2a_latency_us"], c["a2a_eff"])


def fabric(box_name, n=8):
    box = load_box(box_name)
    gpus = tuple(range(n))
    return C.fabric_of(box, gpus, C.ring_bw(box, gpus))


def raw_ms(op, n, elements):
    df = pd.read_csv(RAW_DIR / "nccl_perf.csv.gz")
    df = df[
        (df.op_name == op) & (df.num_gpus == n) & (df.message_size == elements) & (df.nccl_dtype == "half")
    ]
    assert len(df) >= 1
    return float(df.latency.mean())


# ---- NCCL's model -------------------------------------------------------------------------


def test_fabric_of_the_presets():
    rtx, h200, a100 = fabric("rtx-pro-6000-server-8x"), fabric("h200-sxm-8x"), fabric("a100-sxm-8x")
    assert (rtx.kind, rtx.nvswitch) == ("pcie", False)
    assert rtx.bus_bw_bytes_s == 43e9  # the inter-socket link of the preset, the ring's narrowest
    assert (h200.kind, h200.nvswitch, h200.generation) == ("nvlink", True, 90)
    assert a100.generation == 80 and h200.bus_bw_bytes_s == 376e9


def test_pcie_small_all_reduce_is_ring_ll_by_hand():
    """16 KiB over 8 PCIe GPUs: NCCL's ring LL, latency (6.6 + 14 x 1.0 us) x the fitted
    scale, bus bandwidth min(llMaxBw, half the fitted share of the 43 GB/s link),
    algorithm bandwidth x 8 / 14."""
    fab, fit = fabric("rtx-pro-6000-server-8x"), fit_of("pcie")
    t, label = C.nccl_time("all_reduce", 8, 16384, fab, fit)
    bus = min(282.0, 0.5 * fit.bus_eff * 43.0)  # GB/s; the RTX PRO 6000 is Blackwell: llMaxBw 282
    by_hand = fit.latency_scale * (6.6 + 14 * 1.0) * 1e-6 + 16384 / (bus * 1e9 * 8 / 14)
    assert label == "ring/LL" and t == pytest.approx(by_hand, rel=1e-12)


def test_pcie_large_all_gather_is_ring_simple_by_hand():
    fab, fit = fabric("rtx-pro-6000-server-8x"), fit_of("pcie")
    nbytes = 256 * 2**20
    t, label = C.nccl_time("all_gather", 8, nbytes, fab, fit)
    by_hand = fit.latency_scale * (8.4 + 7 * 5.7) * 1e-6 + nbytes / (fit.bus_eff * 43e9 * 8 / 7)
    assert label == "ring/Simple" and t == pytest.approx(by_hand, rel=1e-12)


def test_ll128_only_over_nvlink():
    for op in ("all_reduce", "all_gather"):
        pcie = C.nccl_candidates(op, 8, 1e6, fabric("rtx-pro-6000-server-8x"), fit_of("pcie"))
        nvl = C.nccl_candidates(op, 8, 1e6, fabric("h200-sxm-8x"), fit_of("nvlink"))
        assert not any("LL128" in k for k in pcie) and "ring/LL128" in nvl


def test_tree_only_for_all_reduce_and_nvls_from_hopper_on_an_nvswitch():
    h200 = C.nccl_candidates("all_reduce", 8, 2**28, fabric("h200-sxm-8x"), fit_of("nvlink"))
    a100 = C.nccl_candidates("all_reduce", 8, 2**28, fabric("a100-sxm-8x"), fit_of("nvlink"))
    gather = C.nccl_candidates("all_gather", 8, 2**28, fabric("h200-sxm-8x"), fit_of("nvlink"))
    assert "nvls/Simple" in h200 and "nvls/Simple" not in a100
    assert "tree/Simple" in h200 and not any(k.startswith("tree") for k in gather)
    # NVLS at 256 MiB, by hand: 25 us x scale + bytes / (share x 376 GB/s x 0.85 x 2 x 8 / 14)
    fit = fit_of("nvlink")
    by_hand = fit.latency_scale * 25e-6 + 2**28 / (fit.bus_eff * 376e9 * 0.85 * 2 * 8 / 14)
    assert h200["nvls/Simple"] == pytest.approx(by_hand, rel=1e-12)
    assert C.nccl_time("all_reduce", 8, 2**28, fabric("h200-sxm-8x"), fit)[1] == "nvls/Simple"


@pytest.mark.parametrize("box_name,kind", [("rtx-pro-6000-server-8x", "pcie"), ("b200-8x", "nvlink")])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter"])
def test_nccl_runs_the_fastest_candidate(box_name, kind, op):
    fab, fit = fabric(box_name), fit_of(kind)
    for nbytes in (512, 65536, 2**22, 2**28):
        cands = C.nccl_candidates(op, 8, nbytes, fab, fit)
        t, label = C.nccl_time(op, 8, nbytes, fab, fit)
        assert t == min(cands.values()) and cands[label] == t


def test_alltoall_by_hand():
    fab, fit = fabric("h200-sxm-8x", 4), fit_of("nvlink")
    t, label = C.nccl_time("alltoall", 4, 1e6, fab, fit)
    assert label == "p2p"
    assert t == pytest.approx(fit.a2a_latency_us * 1e-6 + 0.75 * 1e6 / (fit.a2a_eff * 376e9), rel=1e-12)


@pytest.fixture(scope="module")
def llama70b():
    from pipesim.inputs.model import load_model

    return load_model("llama-3.1-70b")


def test_tp_across_nodes_is_nccls_ring_over_the_network(llama70b, profile):
    """TP16 over two L4 boxes joined by 100 GbE (12.5 GB/s, 10 us): NCCL's ring with 2
    network steps (hw NET latency + the network's 10 us; Simple twice, NCCL's flush) and
    28 steps inside the boxes (PCIe latencies, LL x 1.8, at least 1 us of network
    overhead, x 3 for Simple), bytes over the NIC at the PCIe class's share."""
    c = load_box("l4-8x", nodes=2, network="eth-100")
    plan = make_plan(16, 1, llama70b.num_layers, c.gpu_count, "sglang")
    cm = CostModel(c, llama70b, plan, profile)
    gpus, nbytes, n = plan.stage_gpus(0), 8192 * 2 * 64, 16
    t, source = cm.collective("all_reduce", gpus, nbytes)
    fit = fit_of("pcie")
    steps, inter = 2 * (n - 1), 2
    bus = fit.bus_eff * 12.5  # GB/s
    ll = (6.6 + (steps - inter) * max(1.0 * 1.8, 1.0) + inter * (2.7 + 10.0)) * fit.latency_scale * 1e-6
    ll += nbytes / (min(0.5 * bus, 87.7) * 1e9 * n / steps)
    simple = (8.4 + (steps - inter) * max(5.7, 3.0) + inter * (14.0 + 20.0)) * fit.latency_scale * 1e-6
    simple += nbytes / (bus * 1e9 * n / steps)
    assert source == "roofline" and t == pytest.approx(min(ll, simple), rel=1e-12)
    # the same TP8 inside one node is far cheaper
    assert cm.collective("all_reduce", gpus[:8], nbytes)[0] < t / 3


# ---- a measured table, split --------------------------------------------------------------


def test_split_fit_recovers_a_line():
    xs = [2.0**i for i in range(8, 30)]
    s = C.split_fit(xs, [20e-6 + x / 10e9 for x in xs])
    assert s.latency_s == pytest.approx(20e-6, rel=1e-9) and s.bw_bytes_s == pytest.approx(10e9, rel=1e-9)
    assert s.max_rel_err == pytest.approx(0.0, abs=1e-9)


def test_split_fit_keeps_both_parts_non_negative():
    flat = C.split_fit([1e3, 1e4, 1e5], [31e-6, 30e-6, 29e-6])  # no growth: latency only
    assert flat.latency_s == pytest.approx(30e-6, rel=0.05) and flat.bw_bytes_s == float("inf")
    falling = C.split_fit([1e3, 1e6, 1e9], [1e-3, 1e-4, 1e-5])  # a line through these needs a < 0
    assert falling.latency_s >= 0 and falling.bw_bytes_s > 0


@pytest.fixture(scope="module")
def tp8(profile, kimi):
    box = load_box("rtx-pro-6000-server-8x")
    plan = make_plan(8, 1, kimi.num_layers, 8, "sglang")

    def at(scale):
        b = apply_box(box, {"pcie_bandwidth_scale": scale}) if scale != 1 else box
        return CostModel(b, kimi, plan, profile)

    return at


@pytest.mark.parametrize("elements", [4096, 262144, 1048576])
def test_table_read_as_measured_on_its_own_box(tp8, profile, elements):
    t, source = tp8(1).collective("all_reduce", tuple(range(8)), elements * 2)
    assert source == "measured"
    assert t == pytest.approx(
        raw_ms("all_reduce", 8, elements) * 1e-3 * profile.params.allreduce_scale, rel=1e-5
    )


def test_bandwidth_whatif_moves_only_the_bandwidth_part(tp8):
    """t'(k) = latency + (t - latency) / k: halving the links adds the bandwidth part once,
    doubling them takes half of it off, so the two moves are 2 : 1; at 512 MiB (all
    bandwidth) doubling nearly halves the time, at 1 KiB (all latency) it moves little."""
    g = tuple(range(8))
    for nbytes in (2 * 1048576, 2 * 262144):
        (t, src), (slow, s1), (fast, s2) = (tp8(k).collective("all_reduce", g, nbytes) for k in (1, 0.5, 2))
        assert src != C.SCALED and s1 == s2 == C.SCALED
        assert fast < t < slow
        assert (slow - t) / (t - fast) == pytest.approx(2.0, rel=1e-9)
    big = 2 * 268435456
    assert tp8(2).collective("all_reduce", g, big)[0] / tp8(1).collective("all_reduce", g, big)[
        0
    ] == pytest.approx(0.5, abs=0.03)
    small = 2 * 512
    assert tp8(2).collective("all_reduce", g, small)[0] / tp8(1).collective("all_reduce", g, small)[0] > 0.9


def test_a_borrowed_table_moves_to_the_links_of_the_box_it_costs(profile, kimi):
    """The reference box's tables on the Workstation box (55 GB/s between sockets, 43 on
    the Server box, both TOMLs): the 8-GPU ring's bandwidth part x 43 / 55."""
    box = load_box("rtx-pro-6000-workstation-8x")
    cm = CostModel(box, kimi, make_plan(8, 1, kimi.num_layers, 8, "sglang"), replace(profile, foreign="box"))
    assert cm.collectives.bandwidth_ratio(tuple(range(8))) == pytest.approx(55 / 43, rel=1e-12)
    assert cm.collectives.bandwidth_ratio((0, 1)) == pytest.approx(1.0)  # both 55 GB/s inside a socket


def test_whatif_moves_a_measured_tp8(profile):
    """The issue's case: TP8 on the reference box's measured tables, where all-reduce is a
    large share of the GPU time, must answer a link what-if (it did not)."""
    import pipesim

    kw = dict(tp=8, conc=32, warmup_requests=32, measure_requests=64, ci_target=None, profile=profile)
    tok = {
        k: pipesim.predict(pcie_bandwidth_scale=k, **kw, intervals=False).output_throughput_tok_s
        for k in (0.5, 1.0, 2.0)
    }
    assert tok[0.5] < tok[1.0] < tok[2.0]


# ---- the fit file ------------------------------------------------------------------------


def test_fit_file_is_physical():
    assert set(FIT) == {"nvlink", "pcie"}
    for c in FIT.values():
        assert 0.05 < c["bus_eff"] <= 1.0 and 0.05 < c["a2a_eff"] <= 1.0  # a share of the link
        assert 0.5 < c["latency_scale"] < 2.0 and 1.0 < c["a2a_latency_us"] < 50.0
        assert c["fitted_on"]

"""The box catalogue against datasheet figures (written here from the documents, not
copied from the files), the multi-node path by hand formula, and boxes list/show."""

from importlib import resources

import pytest
import tomllib

from pipesim.base.errors import UserError
from pipesim.cli import main
from pipesim.costs.stage import CostModel
from pipesim.inputs.box import NETWORK_NODE, box_from_dict, box_names, cluster, load_box, load_network
from pipesim.inputs.model import load_model
from pipesim.inputs.plan import make_plan
from pipesim.profiles.profile import load_profile

GB, TB, TF = 1e9, 1e12, 1e12

# name: (GPUs, memory in GB (decimal, as datasheets print it), memory TB/s, dense BF16 TFLOPS,
#        dense FP8 TFLOPS, per-GPU link GB/s per direction from the cited document)
DATASHEET = {
    # NVIDIA H100 datasheet (SXM): 80 GB, 3.35 TB/s, 989 / 1,979 TFLOPS dense; NVLink 900 GB/s
    # bidirectional; HGX H100 P2P writes measured 371-377 GB/s (NVIDIA/nccl#1264)
    "h100-sxm-8x": (8, 80, 3.35, 989, 1979, 376),
    "h100-sxm-4x": (4, 80, 3.35, 989, 1979, 376),  # four of the same GPUs behind the same NVSwitch
    # NVIDIA H200 datasheet: 141 GB, 4.8 TB/s, same Hopper rates, same NVLink 4 fabric
    "h200-sxm-8x": (8, 141, 4.8, 989, 1979, 376),
    # DGX B200: 1,440 GB / 8 GPUs; 72 PFLOPS FP8 sparse / 8 / 2 = 4.5 PFLOPS dense; NVLink 5 1.8 TB/s bidirectional
    "b200-8x": (8, 180, 7.7, 2250, 4500, 900),
    # NVIDIA A100 80GB SXM datasheet: 2,039 GB/s, BF16 312 dense (624 sparse); no FP8: bf16 math; NVLink 600 GB/s bidir.
    "a100-sxm-8x": (8, 80, 2.039, 312, 312, 300),
    # NVIDIA L40S datasheet: 48 GB, 864 GB/s, FP8 1,466 sparse = 733 dense; PCIe Gen4 x16 = 32 GB/s
    "l40s-8x": (8, 48, 0.864, 362.05, 733, 32),
    # NVIDIA L4 datasheet: 24 GB, 300 GB/s, FP8 485 sparse = 242 dense; PCIe Gen4 x16
    "l4-8x": (8, 24, 0.300, 121, 242, 32),
    # H100 PCIe: 80 GB, 2 TB/s, BF16 1,513 sparse = 756.5 dense; PCIe Gen5 x16 = 64 GB/s
    "h100-pcie-8x": (8, 80, 2.0, 756.5, 1513, 64),
    # RTX PRO 6000 Blackwell Workstation datasheet: 96 GB, 1,792 GB/s, 4,000 AI TOPS (FP4 sparse) -> FP8 1,000 dense
    "rtx-pro-6000-workstation-4x": (4, 96, 1.792, 500, 1000, 55),
    "rtx-pro-6000-workstation-8x": (8, 96, 1.792, 500, 1000, 55),
    # Ada whitepaper, RTX 4090: 24 GB, 1,008 GB/s, FP16 tensor with FP32 accumulate 165.2 dense, FP8 330.3;
    # no P2P: 25.8 GB/s bidirectional through host memory (tinygrad/open-gpu-kernel-modules#6) -> 12.9 each way
    "rtx-4090-4x": (4, 24, 1.008, 165.2, 330.3, 12.9),
    "rtx-4090-8x": (8, 24, 1.008, 165.2, 330.3, 12.9),
    # RTX Blackwell whitepaper, RTX 5090: 32 GB, 1,792 GB/s; no P2P: 56.6 GB/s bidirectional (aikitoria#9) -> 28.3
    "rtx-5090-4x": (4, 32, 1.792, 209.5, 419, 28.3),
    "rtx-5090-8x": (8, 32, 1.792, 209.5, 419, 28.3),
    # NVIDIA L40 datasheet: 48 GB, 864 GB/s, BF16 181.05 | 362.1 sparse, FP8 362 | 724 sparse; PCIe Gen4 x16
    "l40-8x": (8, 48, 0.864, 181.05, 362, 32),
    # A10G: no NVIDIA datasheet; AWS G5: 24 GiB each; Baseten's A10 vs A10G table: 600 GB/s, BF16 70 TF;
    # Ampere: no FP8; PCIe Gen4 x16
    "a10g-8x": (8, 24, 0.600, 70, 70, 32),
    # NVIDIA RTX A6000 datasheet: 48 GB, 768 GB/s, tensor 309.7 TFLOPS with sparsity; Ampere: no FP8; PCIe Gen4
    "rtx-a6000-8x": (8, 48, 0.768, 154.85, 154.85, 32),
    # NVIDIA RTX 6000 Ada datasheet: 48 GB, 960 GB/s, tensor 1,457 TFLOPS = FP8 with sparsity; PCIe Gen4
    "rtx-6000-ada-8x": (8, 48, 0.960, 1457 / 4, 1457 / 2, 32),
    # NVIDIA A100 datasheet, 40 GB SXM: 1,555 GB/s, BF16 312 dense; NVLink 600 GB/s bidirectional
    "a100-sxm-40gb-8x": (8, 40, 1.555, 312, 312, 300),
    # H20 (vendors' product specifications): 96 GB HBM3, 4.0 TB/s, BF16 148, FP8 296 dense; NVLink 4 as H100's
    "h20-8x": (8, 96, 4.0, 148, 296, 376),
}


def raw(name):
    return tomllib.loads(
        resources.files("pipesim.data").joinpath("boxes").joinpath(f"{name}.toml").read_text()
    )


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_preset_matches_its_datasheet(name):
    gpus, mem_gb, bw_tb, bf16, fp8, link_gb = DATASHEET[name]
    box = load_box(name)
    assert box.gpu_count == gpus
    # capacity: decimal GB on the datasheet; the file holds what the GPU reports, a few % below or 2^30-based above
    assert box.gpu.memory_bytes == pytest.approx(mem_gb * GB, rel=0.08)
    assert box.gpu.mem_bw_bytes_s == pytest.approx(bw_tb * TB, rel=1e-3)
    assert box.gpu.flops_bf16 == pytest.approx(bf16 * TF, rel=2e-3)
    assert box.gpu.flops_fp8 == pytest.approx(fp8 * TF, rel=2e-3)
    first_links = [lk.bw_bytes_s for lk in box.links if lk.child.startswith("gpu")]
    assert len(first_links) == gpus and all(bw == pytest.approx(link_gb * GB, rel=1e-3) for bw in first_links)


def test_every_preset_is_named_for_its_file_and_cites_its_numbers():
    for name in box_names():
        data = raw(name)
        assert data["name"] == name  # names are unique: one file each
        box = load_box(name)
        cited = dict(box.sources)
        for field in ("memory_bytes", "mem_bw_bytes_s", "flops"):
            assert cited.get(field), (name, field)
        if box.gpu_count > 1:
            assert cited.get("topology") and box.network is not None and cited.get("network"), name


@pytest.mark.parametrize("name", ["h100-sxm-8x", "h200-sxm-8x", "b200-8x", "a100-sxm-8x"])
def test_nvswitch_is_one_hop_each_way(name):
    box = load_box(name)
    for a, b in [(0, 1), (0, 7), (3, 4)]:
        assert box.path(a, b) == ((f"gpu{a}", "nvswitch"), ("nvswitch", f"gpu{b}"))


@pytest.mark.parametrize("name", ["rtx-4090-4x", "rtx-5090-4x"])
def test_geforce_copies_go_through_host_memory(name):
    box = load_box(name)
    assert box.path(0, 3) == (("gpu0", "host"), ("host", "gpu3"))
    link = box.link(("gpu0", "host"))
    # by hand: two host-path links, each half the measured GPU-to-GPU latency
    assert box.p2p_time_s(0, 3, 1e6) == pytest.approx(2 * link.latency_s + 1e6 / link.bw_bytes_s)


def test_hopper_and_ada_have_no_fp4_and_ampere_no_fp8():
    for name in (
        "h100-sxm-8x",
        "h200-sxm-8x",
        "h20-8x",
        "l40s-8x",
        "l40-8x",
        "l4-8x",
        "rtx-4090-8x",
        "rtx-6000-ada-8x",
    ):
        g = load_box(name).gpu
        assert g.flops_fp4 == g.flops_fp8
    for name in ("a100-sxm-8x", "a100-sxm-40gb-8x", "a10g-8x", "rtx-a6000-8x"):
        g = load_box(name).gpu
        assert g.flops_fp8 == g.flops_bf16 == g.flops_fp4


@pytest.mark.parametrize(
    "name", ["l40-8x", "a10g-8x", "rtx-a6000-8x", "rtx-6000-ada-8x", "a100-sxm-40gb-8x", "h20-8x"]
)
def test_unmeasured_gpus_are_costed_by_first_principles_and_say_so(name, capsys):
    # no AIConfigurator measurement of these GPUs: an A100 40 GB is not the 80 GB card measured
    # (1,555 against 2,039 GB/s), so it must not borrow those tables
    assert load_box(name).aiconfigurator_system == ""
    main(["boxes", "show", name])
    out = capsys.readouterr().out
    assert out.count("first principles: the roofline on the box's datasheet rates") == 2  # sglang and vllm


# ---- a cluster ------------------------------------------------------------------------------


def test_one_node_cluster_is_the_box():
    box = load_box("rtx-pro-6000-server-8x")
    assert cluster(box, 1) is box


def test_cluster_numbers_gpus_node_major():
    c = load_box("h100-sxm-8x", nodes=3)
    assert c.gpu_count == 24 and c.gpus_per_node == 8
    assert [c.node_of(g) for g in (0, 7, 8, 15, 16, 23)] == [0, 0, 1, 1, 2, 2]
    # the copy of node 1's tree: gpu8..gpu15 under their own switch
    assert c.path(8, 15) == (("gpu8", "n1.nvswitch"), ("n1.nvswitch", "gpu15"))
    assert not c.spans_nodes((8, 9, 10, 11)) and c.spans_nodes((7, 8))


@pytest.mark.parametrize("nbytes", [16, 8192 * 2, 1e6, 1e9])
def test_cross_node_hop_by_hand(nbytes):
    c = load_box("h100-sxm-8x", nodes=2, network="ib-ndr-400")
    assert c.path(3, 11) == (("gpu3", NETWORK_NODE), (NETWORK_NODE, "gpu11"))
    # InfiniBand NDR: 400 Gb/s = 50 GB/s per direction; 2 us one message (networks.toml)
    assert c.p2p_time_s(3, 11, nbytes) == pytest.approx(2e-6 + nbytes / 50e9, rel=1e-12)


@pytest.fixture(scope="module")
def llama70b():
    return load_model("llama-3.1-70b")


@pytest.fixture(scope="module")
def profile():
    return load_profile("rtx-pro-6000-sglang-healthy")


def test_pp_hop_across_nodes_pays_the_nic(llama70b, profile):
    c = load_box("a100-sxm-8x", nodes=2)  # HDR 200 Gb/s: 25 GB/s per GPU, 2 us
    plan = make_plan(4, 4, llama70b.num_layers, c.gpu_count, "sglang")
    cm = CostModel(c, llama70b, plan, profile)
    # stage 1 (GPUs 4-7) -> stage 2 (GPUs 8-11) crosses nodes: each rank sends 1/4 over its own NIC
    lat, per_byte = cm._hop_path(1, 2)
    assert lat == pytest.approx(2e-6)
    assert per_byte == pytest.approx(0.25 / 25e9)
    # stage 0 -> 1 stays on node 0's NVSwitch (2 links of 1 us, 300 GB/s)
    lat0, per_byte0 = cm._hop_path(0, 1)
    assert lat0 == pytest.approx(2e-6) and per_byte0 == pytest.approx(0.25 / 300e9)


def test_cluster_needs_a_network():
    with pytest.raises(UserError, match="no \\[network\\] section"):
        load_box("h200-1x", nodes=2)
    assert load_network("roce-400").nic_bw_bytes_s == 400e9 / 8


# ---- validation -----------------------------------------------------------------------------


def _box(links, count=2):
    return {
        "gpu": {"name": "g", "count": count, "memory_bytes": 1e9, "mem_bw_bytes_s": 1e12, "flops_bf16": 1e14},
        "topology": {"links": [{"child": c, "parent": p, "bw_gb_s": 1, "latency_us": 1} for c, p in links]},
    }


def test_cycle_is_rejected():
    with pytest.raises(UserError, match=r"cycle \(x -> y -> x\)"):
        box_from_dict(_box([("gpu0", "x"), ("gpu1", "x"), ("x", "y"), ("y", "x")]))


def test_self_parent_and_bool_count_are_rejected():
    with pytest.raises(UserError, match="its own parent"):
        box_from_dict(_box([("gpu0", "gpu0"), ("gpu1", "a")]))
    with pytest.raises(UserError, match="gpu.count"):
        box_from_dict(_box([("gpu0", "a"), ("gpu1", "a")], count=True))


# ---- the commands ---------------------------------------------------------------------------


def test_boxes_list_one_line_per_preset(capsys):
    main(["boxes", "list"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(box_names()) >= 15
    by_name = {line.split()[0]: line for line in lines}
    assert "8 x NVIDIA H100" in by_name["h100-sxm-8x"] and "80.0 GiB" in by_name["h100-sxm-8x"]
    assert "NVSwitch" in by_name["b200-8x"] and "no P2P" in by_name["rtx-4090-4x"]


def test_boxes_show_fields_sources_and_tree(capsys):
    main(["boxes", "show", "rtx-5090-8x"])
    out = capsys.readouterr().out
    for text in (
        "mem_bw_bytes_s           1.792 TB/s",
        "aikitoria/open-gpu-kernel-modules/issues/9",
        "gpu4 -> host1: 28.3 GB/s per direction, 7.2 us",
        "host1 -> host0",
        "100 GbE",
    ):
        assert text in out, text


def test_boxes_show_a_cluster(capsys):
    main(["boxes", "show", "h100-sxm-8x", "--nodes", "2"])
    out = capsys.readouterr().out
    assert "gpu15 -> n1.nvswitch" in out and "50 GB/s per GPU per direction" in out

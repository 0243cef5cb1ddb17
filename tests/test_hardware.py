"""The box and its PCIe tree: paths and first-principles P2P cost, against the TOML."""

from importlib import resources

import pytest
import tomllib

from pipesim.base.errors import UserError
from pipesim.inputs.box import box_from_dict, box_names, load_box

BOX = "rtx-pro-6000-server-8x"


@pytest.fixture(scope="module")
def box():
    return load_box(BOX)


@pytest.fixture(scope="module")
def toml_links():
    """The box file's links, read independently of pipesim: child -> (parent, B/s, s)."""
    text = resources.files("pipesim.data").joinpath("boxes").joinpath(f"{BOX}.toml").read_text()
    data = tomllib.loads(text)
    return {
        lk["child"]: (lk["parent"], lk["bw_gb_s"] * 1e9, lk["latency_us"] * 1e-6)
        for lk in data["topology"]["links"]
    }


def test_default_box_is_a_preset(box):
    assert BOX in box_names()
    assert box.gpu_count == 8
    # physics.md §3: 96 GB class card, 97,887 MiB reported
    assert box.gpu.memory_bytes == 97887 * 2**20


def test_same_socket_path_crosses_two_links(box):
    assert box.path(0, 1) == (("gpu0", "socket0"), ("socket0", "gpu1"))


def test_cross_socket_path_crosses_three_links(box):
    # gpu3 on socket0, gpu4 on socket1: up, across the socket link, down
    assert box.path(3, 4) == (("gpu3", "socket0"), ("socket0", "socket1"), ("socket1", "gpu4"))
    assert len(box.path(4, 3)) == 3
    assert box.path(4, 3) == (("gpu4", "socket1"), ("socket1", "socket0"), ("socket0", "gpu3"))


def test_path_to_self_is_empty(box):
    assert box.path(5, 5) == ()
    assert box.p2p_time_s(5, 5, 1e6) == 0.0


@pytest.mark.parametrize("nbytes", [4, 28 * 1024, 1e6, 1e9])
def test_p2p_same_socket_by_hand(box, toml_links, nbytes):
    _, bw0, lat0 = toml_links["gpu0"]
    _, bw1, lat1 = toml_links["gpu1"]
    expected = lat0 + lat1 + nbytes / min(bw0, bw1)
    assert box.p2p_time_s(0, 1, nbytes) == pytest.approx(expected, rel=1e-12)
    # physics.md §3: 55 GB/s within a socket, ~0.5 us P2P latency
    assert expected == pytest.approx(0.5e-6 + nbytes / 55e9, rel=1e-12)


@pytest.mark.parametrize("nbytes", [4, 28 * 1024, 1e6, 1e9])
def test_p2p_cross_socket_by_hand(box, toml_links, nbytes):
    _, bw3, lat3 = toml_links["gpu3"]
    _, bws, lats = toml_links["socket1"]
    _, bw4, lat4 = toml_links["gpu4"]
    expected = lat3 + lats + lat4 + nbytes / min(bw3, bws, bw4)
    assert box.p2p_time_s(3, 4, nbytes) == pytest.approx(expected, rel=1e-12)
    assert box.p2p_time_s(4, 3, nbytes) == pytest.approx(expected, rel=1e-12)
    # the socket link (43 GB/s) is the narrowest
    assert min(bw3, bws, bw4) == 43e9


def test_cross_socket_slower_than_same_socket(box):
    assert box.p2p_time_s(3, 4, 1e6) > box.p2p_time_s(0, 1, 1e6)


def test_ring_links_of_a_socket_stay_in_it(box):
    links = box.ring_links((0, 1, 2, 3))
    assert all("socket1" not in d for d in links)
    # both directions of each GPU's link
    assert len(links) == 8


def test_disconnected_box_is_user_error():
    data = {
        "gpu": {"name": "g", "count": 2, "memory_bytes": 1e9, "mem_bw_bytes_s": 1e12, "flops_bf16": 1e14},
        "topology": {
            "links": [
                {"child": "gpu0", "parent": "a", "bw_gb_s": 1, "latency_us": 1},
                {"child": "gpu1", "parent": "b", "bw_gb_s": 1, "latency_us": 1},
            ]
        },
    }
    with pytest.raises(UserError):
        box_from_dict(data)


def test_unknown_box_is_user_error():
    with pytest.raises(UserError) as exc:
        load_box("no-such-box")
    assert BOX in str(exc.value)

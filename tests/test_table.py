"""The human table's slot positions (report/table.py): values as given, positions that
read the same merged, and the line that says what they mean."""

from __future__ import annotations

from dataclasses import replace

import pytest

import pipesim
from pipesim.report.table import table


@pytest.fixture(scope="module")
def base():
    """A cheap SGLang prediction whose slot figures each test replaces by hand."""
    return pipesim.predict(tp=8, conc=2, model="llama-3.1-8b", input_len=16, output_len=8)


def _lines(result) -> list[str]:
    text = table(result).splitlines()
    i = next(i for i, line in enumerate(text) if "by position" in line)
    return text[i : i + 4]


def test_two_slots_of_four_never_in_flight(base):
    r = replace(
        base, occupancy_by_position=[49.08, 13.36, 0.0, 0.0], empty_share_by_position=[0.0, 0.004, 1.0, 1.0]
    )
    head, means, empty, meaning = _lines(r)
    assert head.split()[:6] == ["slots", "by", "position", "1st", "2nd", "3rd-4th"]
    assert means.split() == ["mean", "requests", "49.1", "13.4", "0.0"]
    assert empty.split() == ["time", "empty", "0%", "0%", "100%"]  # 0.4% rounds to 0%
    # 1 + 0.996 batches in flight on average
    assert (
        meaning.strip()
        == "2.0 of 4 slots have a batch in flight on average; 2 never do: the pipeline cannot fill"
    )
    # the columns line up under their positions
    assert [means.index(x) + len(x) for x in ("49.1", "13.4")] == [
        head.index(x) + len(x) for x in ("1st", "2nd")
    ]


def test_a_full_pipeline_and_an_unequal_one(base):
    full = replace(base, occupancy_by_position=[8.0, 8.0, 8.0], empty_share_by_position=[0.0, 0.0, 0.0])
    assert _lines(full)[0].split()[3] == "1st-3rd"
    assert (
        _lines(full)[3]
        .strip()
        .endswith("3.0 of 3 slots have a batch in flight on average; the pipeline is full")
    )
    unequal = replace(base, occupancy_by_position=[12.0, 8.0, 4.0], empty_share_by_position=[0.0, 0.0, 0.0])
    assert _lines(unequal)[3].strip().endswith("unequal batches: the fullest sets the pace")
    short = replace(base, occupancy_by_position=[5.0, 4.0, 2.7], empty_share_by_position=[0.0, 0.0, 0.09])
    assert "2.9 of 3" in _lines(short)[3] and "runs short of batches" in _lines(short)[3]
    nearly = replace(base, occupancy_by_position=[5.0, 0.01], empty_share_by_position=[0.0, 0.998])
    assert "1 almost never do" in _lines(nearly)[3]


def test_vllm_says_groups_and_one_position_prints_nothing(base):
    sc = {
        **base.scenario,
        "engine": {
            **base.scenario["engine"],
            "engine": "vllm",
            "max_num_seqs": 8,
            "max_concurrent_batches": 2,
            "gpu_memory_utilization": 0.9,
        },
    }
    r = replace(base, scenario=sc, occupancy_by_position=[4.0, 4.0], empty_share_by_position=[0.0, 0.0])
    assert _lines(r)[0].startswith("  groups by position")
    one = replace(base, occupancy_by_position=[16.0], empty_share_by_position=[0.0])
    assert "by position" not in table(one)  # one position: nothing to compare
    assert "decode batch per slot" not in table(r)

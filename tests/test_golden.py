"""Behaviour unchanged: 26 predictions give every figure they gave when
tests/data/golden.json was written (tests/golden.py says how and when to rewrite it).

Each figure is compared to the float: integers and text exactly, floats within RTOL,
a few units in the last place of a sum (numpy may sum in another order on another
CPU). A change that is meant to move no number (a restructure, a speed-up) moves
none; a real change moves figures by far more."""

import json
import math

import pytest
from golden import GOLDEN_FILE, SCENARIOS, compute

RTOL = 1e-12
GOLDEN = json.loads(GOLDEN_FILE.read_text())


def test_the_file_holds_every_scenario():
    assert set(GOLDEN) == set(SCENARIOS)


def differences(want: object, got: object, at: str = "") -> list[str]:
    """Paths where two JSON values differ (a float compared exactly)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{at}.{k}: missing" for k in want if k not in got]
        out += [f"{at}.{k}: new" for k in got if k not in want]
        for k in want.keys() & got.keys():
            out += differences(want[k], got[k], f"{at}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in differences(a, b, f"{at}[{i}]")]
    if (
        isinstance(want, float)
        and isinstance(got, float)
        and math.isclose(want, got, rel_tol=RTOL, abs_tol=0)
    ):
        return []
    return [] if want == got and type(want) is type(got) else [f"{at}: {want!r} -> {got!r}"]


def test_differences_sees_one_bit():
    assert differences({"a": [1.0, {"b": 0.3}]}, {"a": [1.0, {"b": 0.3}]}) == []
    assert differences({"b": 0.3}, {"b": math.nextafter(0.3, 1.0)}) == []  # one unit in the last place
    assert differences({"b": 0.3}, {"b": 0.3 * (1 + 1e-11)}) == [".b: 0.3 -> 0.300000000003"]
    assert differences({"b": [1, 2]}, {"b": [1]}) == [".b: [1, 2] -> [1]"]
    assert differences({"a": 1}, {"a": 1.0}) == [".a: 1 -> 1.0"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_figure_is_unchanged(name):
    got = json.loads(json.dumps(compute(name)))
    diff = differences(GOLDEN[name], got)
    assert not diff, f"{name}: {len(diff)} figure(s) moved:\n" + "\n".join(sorted(diff)[:40])

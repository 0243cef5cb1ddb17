"""TOML written by pipesim (base/toml.py, through tomli-w) reads back as what was
written: no "None" strings, numpy numbers as numbers, a dotted key as one key."""

import numpy as np
import pytest

from pipesim.base.toml import dumps, toml_reader


def test_round_trip_of_what_the_old_writer_got_wrong():
    data = {
        "name": "p",
        "unset": None,
        "scale": np.float64(0.5),
        "count": np.int64(3),
        "free": {"cpu_iteration_ms": np.float32(0.25), "gone": None},
        "flags": {"--mem-fraction-static": 0.8, "a.b": "dotted key, one key"},
        "links": [{"a": 1, "bw": np.float64(55.0)}, {"a": 2, "bw": 43.0}],
        "sizes": (1, 2, 4),
        "text": 'quote " and § sign',
    }
    back = toml_reader.loads(dumps(data))
    assert "unset" not in back and "gone" not in back["free"]
    assert back["scale"] == 0.5 and isinstance(back["scale"], float)
    assert back["count"] == 3 and isinstance(back["count"], int)
    assert back["free"]["cpu_iteration_ms"] == 0.25
    assert back["flags"] == {"--mem-fraction-static": 0.8, "a.b": "dotted key, one key"}
    assert back["links"] == [{"a": 1, "bw": 55.0}, {"a": 2, "bw": 43.0}]
    assert back["sizes"] == [1, 2, 4] and back["text"] == 'quote " and § sign'


def test_a_none_inside_a_list_is_refused():
    with pytest.raises(ValueError, match="TOML has no null"):
        dumps({"x": [1, None]})

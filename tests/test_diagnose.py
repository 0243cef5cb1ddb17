"""Diagnosis of the reference deployment against its own tables."""

from __future__ import annotations

import pytest

from pipesim.profiles.profile import load_profile

DEPLOYMENT = "rtx-pro-6000-sglang-deployment"


# ---- diagnosis ------------------------------------------------------------------------


def test_diagnosis_of_the_reference_deployment():
    """TP8 C=1 ran at 26.3 tok/s where the tables give ~100: charged to all-reduce alone,
    each of the 123 per step must cost (1/26.3 - 1/tables) / 123 more than the table;
    that cause cannot also explain TP8 C=32, while a CPU launch bound explains all."""
    from pipesim.calibrate.diagnose import diagnose

    d = diagnose(load_profile(DEPLOYMENT))
    tp8 = next(x for x in d.points if x.point.tp == 8 and x.point.conc == 1)
    assert tp8.allreduces_per_step == 2 * 61 + 1
    extra_us = (1 / 26.3 - 1 / tp8.tables_only) / tp8.allreduces_per_step * 1e6
    assert tp8.needed["allreduce_offset_us"] == pytest.approx(extra_us, rel=0.05)
    assert (tp8.allreduce_table_us + extra_us) / tp8.allreduce_table_us > 5  # far slower than the NCCL table
    assert d.consistency["eager_launch_us_per_layer"][1] <= 10
    assert d.consistency["allreduce_offset_us"][1] > 10
    assert "ruled out" in d.text() and "NCCL table" in d.text()
    # --json: the same numbers as data, strict JSON
    import json

    from pipesim.base.jsonout import dumps

    obj = json.loads(dumps(d.to_dict()), parse_constant=lambda t: pytest.fail(f"not JSON: {t}"))
    [row] = [r for r in obj["points"] if r["point"].startswith("TP8 C=1")]
    assert row["tables_only"] == pytest.approx(tp8.tables_only)
    assert row["needed_alone"]["allreduce_offset_us"] == pytest.approx(extra_us, rel=0.05)
    assert obj["consistency"]["eager_launch_us_per_layer"]["mape_pct"] <= 10

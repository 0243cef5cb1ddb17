"""Metric helpers (metrics.py) against their definitions."""

import numpy as np
import pytest

from pipesim.measure.sketch import percentile


@pytest.mark.parametrize("n", [1, 2, 3, 16, 17, 1001])
def test_percentile_is_numpys_linear_rule(n):
    # the same rule as np.percentile's default, bit for bit (metrics.py computes it
    # directly to keep numpy.ma out of a prediction)
    rng = np.random.default_rng(n)
    for scale in (1e-3, 1.0, 1e3):
        v = rng.exponential(scale, size=n)
        for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
            assert percentile(v, q) == float(np.percentile(v, q))


def test_percentile_of_nothing_is_nan():
    assert np.isnan(percentile([], 50))


def test_percentile_by_hand():
    # (n - 1) q = 3 x 0.5 = 1.5: halfway between the second and third sorted values
    assert percentile([40.0, 10.0, 20.0, 30.0], 50) == 25.0
    assert percentile([40.0, 10.0, 20.0, 30.0], 100) == 40.0

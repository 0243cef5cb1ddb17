"""The quantile sketch against exact percentiles (metrics.percentile, np.percentile's
rule): within its stated relative error on random and adversarial data."""

import math

import numpy as np
import pytest

from pipesim.measure.sketch import MAX_BINS, REL_ERROR, QuantileSketch, percentile

QS = (0, 0.1, 1, 5, 25, 50, 75, 90, 95, 99, 99.9, 100)
SLACK = 1e-12  # float rounding of log / pow at a bin's edge


def sketch_of(values, **kw) -> QuantileSketch:
    s = QuantileSketch(**kw)
    s.extend(values)
    return s


def assert_within(values, s: QuantileSketch, qs=QS, ks=None) -> None:
    """Each percentile within the bound of the exact one: for one-signed data within
    REL_ERROR of it; in general within REL_ERROR of the two order statistics it
    interpolates."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    for q in qs:
        exact = percentile(values, q)
        pos = (n - 1) * q / 100
        lo = int(pos)
        t = pos - lo
        hi = min(lo + 1, n - 1)
        scale = (1 - t) * abs(x[lo]) + t * abs(x[hi])
        assert abs(s.percentile(q) - exact) <= s.rel_error * scale * (1 + SLACK) + 1e-300, (q, exact)
    for k in sorted({0, 1, n // 3, n // 2, n - 2, n - 1}) if ks is None else ks:
        if 0 <= k < n:
            assert abs(s.order_stat(k) - x[k]) <= s.rel_error * abs(x[k]) * (1 + SLACK), k


def test_stated_bound_is_the_bin_width():
    # gamma = (1 + a) / (1 - a): a bin (g^(i-1), g^i] read as 2 g^i / (g + 1) is off
    # by (g - 1) / (g + 1) = a at either edge
    s = QuantileSketch()
    g = s._gamma
    assert (g - 1) / (g + 1) == pytest.approx(REL_ERROR, rel=1e-12)
    edge_lo, edge_hi = g**9 * (1 + 1e-12), g**10
    r = s._reading(10)
    assert abs(r - edge_hi) / edge_hi == pytest.approx(REL_ERROR, rel=1e-6)
    assert abs(r - edge_lo) / edge_lo == pytest.approx(REL_ERROR, rel=1e-6)


@pytest.mark.parametrize(
    "draw",
    [
        lambda g: g.lognormal(3.0, 1.5, 20_000),  # latency-like, long tail
        lambda g: g.exponential(40.0, 20_000),
        lambda g: g.uniform(1.0, 2.0, 20_000),  # narrow: many values per bin
        lambda g: np.concatenate((g.normal(5, 0.1, 9_900), g.normal(5e4, 10, 100))),  # far outliers at p99
        lambda g: g.pareto(1.1, 20_000) + 1e-3,  # heavy tail
        lambda g: g.normal(0, 1, 20_000),  # both signs
        lambda g: g.integers(0, 5, 20_000).astype(float),  # zeros and repeats
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_data_within_bound(draw, seed):
    values = draw(np.random.default_rng(seed))
    s = sketch_of(values)
    assert s.count == len(values)
    assert s.mean == pytest.approx(float(np.mean(values)), rel=1e-9, abs=1e-12)
    assert_within(values, s)


def test_bin_edges_exactly():
    # values exactly on bin edges g^i, where log / pow rounding decides the bin
    g = QuantileSketch()._gamma
    values = [g**i for i in range(-400, 400)] * 3
    assert_within(values, sketch_of(values))


def test_two_values_interpolated_within_bound():
    # the percentile between two far-apart values: both readings within the bound,
    # so is their interpolation (one sign)
    for values in ([1.0, 1e9], [1e-9, 3.0], [7.0, 7.0]):
        s = sketch_of(values)
        for q in (10, 50, 90):
            exact = percentile(values, q)
            assert abs(s.percentile(q) - exact) <= REL_ERROR * exact * (1 + SLACK)


def test_extremes_exact_and_small_counts():
    assert math.isnan(QuantileSketch().percentile(50))
    assert math.isnan(QuantileSketch().mean)
    s = sketch_of([3.25])
    assert s.percentile(0) == s.percentile(50) == s.percentile(100) == 3.25
    values = [0.1234, 98765.4321, 17.0]
    s = sketch_of(values)
    assert s.percentile(0) == 0.1234 and s.percentile(100) == 98765.4321


def test_order_of_arrival_does_not_matter():
    values = np.random.default_rng(5).lognormal(2, 1, 5000)
    a, b, c = sketch_of(values), sketch_of(np.sort(values)), sketch_of(np.sort(values)[::-1])
    for q in QS:
        assert a.percentile(q) == b.percentile(q) == c.percentile(q)


def test_memory_flat_in_the_number_of_values():
    # a million values of a latency-like spread: the bins are set by the values'
    # range (log_gamma of max/min), not by how many there are
    g = np.random.default_rng(3)
    s = QuantileSketch()
    for _ in range(10):
        s.extend(g.lognormal(3.0, 1.0, 100_000).tolist())
    assert s.count == 1_000_000
    bound = math.log(s.max / s.min) / s._log_gamma + 2
    assert s.bins() <= bound < 2_000


def test_range_beyond_the_bins_keeps_the_upper_percentiles():
    # adversarial: 10% of the values spread over 1e-300 .. 1e-10, one bin each, need
    # more than MAX_BINS bins; the smallest magnitudes are merged, the memory stays
    # bounded and every percentile above them keeps the bound
    g = np.random.default_rng(4)
    values = np.concatenate((10.0 ** g.uniform(-300, -10, 5_000), g.lognormal(3, 2, 45_000)))
    s = sketch_of(values)
    assert len(set(np.ceil(np.log(values) / s._log_gamma))) > MAX_BINS >= s.bins()
    n = len(values)
    assert_within(values, s, qs=(25, 50, 75, 90, 99, 99.9, 100), ks=(n // 4, n // 2, n - 2, n - 1))
    small = sketch_of(values, max_bins=64)
    assert small.bins() <= 64
    assert small.percentile(100) == values.max()


def test_subnormal_and_huge_magnitudes():
    values = [5e-324, 1e-310, 2.5e-308, 1.0, 1e300, 1.7e308]
    assert_within(values, sketch_of(values))


def test_bad_values_refused():
    s = QuantileSketch()
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="finite"):
            s.add(bad)
    with pytest.raises(ValueError, match="rel_error"):
        QuantileSketch(rel_error=0)
    with pytest.raises(IndexError):
        s.order_stat(0)

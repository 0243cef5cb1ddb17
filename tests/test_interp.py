"""Interpolation in measured tables: exact at points, linear between, proportional
above the largest point, clamped below the smallest."""

import math

import pytest

from pipesim.profiles.curves import Curve, Surface, bracket


@pytest.fixture
def curve():
    return Curve([4, 1, 2], [60.0, 10.0, 20.0])  # unsorted on purpose


@pytest.mark.parametrize("x,y", [(1, 10.0), (2, 20.0), (4, 60.0)])
def test_exact_at_points(curve, x, y):
    assert curve(x) == y


@pytest.mark.parametrize("x,y", [(1.5, 15.0), (3, 40.0), (2.5, 30.0), (3.9, 58.0)])
def test_linear_between(curve, x, y):
    assert curve(x) == pytest.approx(y)


@pytest.mark.parametrize("x", [5, 8, 100])
def test_proportional_above_max(curve, x):
    assert curve(x) == pytest.approx(60.0 * x / 4)


@pytest.mark.parametrize("x", [0, 0.5, -3])
def test_clamped_below_min(curve, x):
    assert curve(x) == 10.0


def test_nan_points_dropped():
    c = Curve([1, 2, math.nan, 3], [1.0, math.nan, 5.0, 3.0])
    assert c.xs == [1.0, 3.0]
    assert c(2) == pytest.approx(2.0)


def test_empty_curve_rejected():
    with pytest.raises(ValueError):
        Curve([math.nan], [1.0])


def test_single_point_curve():
    c = Curve([8], [2.0])
    assert c(8) == 2.0 and c(1) == 2.0 and c(16) == pytest.approx(4.0)


def test_bracket():
    grid = [1.0, 2.0, 4.0]
    assert bracket(grid, 2.0) == [(1, 1.0)]
    (i, wi), (j, wj) = bracket(grid, 3.0)
    assert (i, j) == (1, 2) and wi == pytest.approx(0.5) and wj == pytest.approx(0.5)
    assert bracket(grid, 0.5) == [(0, 1.0)]
    assert bracket(grid, 8.0) == [(2, 2.0)]


@pytest.fixture
def surface():
    # row a=1: y = b; row a=3: y = 3b (both on b in [1, 10])
    return Surface({3.0: Curve([1, 10], [3, 30]), 1.0: Curve([1, 10], [1, 10])})


def test_surface_exact_on_grid(surface):
    assert surface(1, 1) == 1 and surface(1, 10) == 10
    assert surface(3, 1) == 3 and surface(3, 10) == 30


def test_surface_linear_in_both_axes(surface):
    assert surface(1, 5.5) == pytest.approx(5.5)
    assert surface(2, 5) == pytest.approx(0.5 * 5 + 0.5 * 15)
    assert surface(2.5, 10) == pytest.approx(0.25 * 10 + 0.75 * 30)


def test_surface_outside_outer_grid(surface):
    assert surface(0.5, 5) == pytest.approx(5.0)  # clamped to the first row
    assert surface(6, 5) == pytest.approx(15.0 * 6 / 3)  # proportional beyond the last row


def test_surface_outside_inner_grid(surface):
    assert surface(1, 20) == pytest.approx(20.0)  # row curve proportional above max
    assert surface(3, 0.1) == pytest.approx(3.0)  # clamped below min

"""Progress with an ETA: the units a command reports add up to the total its bar was
given (so the ETA is about the real remaining work), and bars go to stderr, only when
asked for or on a terminal."""

from pipesim.calibrate.fit import fit, max_simulations
from pipesim.cli import main
from pipesim.profiles.profile import load_profile


def test_fit_reports_each_simulation_with_a_total_from_the_first():
    """Every simulation is reported, counted up one at a time; the total the bar is given
    is known from the first (an ETA from the first evaluation), never below the count,
    and the simulations stay within the bound the work check was given."""
    prof = load_profile("rtx-pro-6000-sglang-deployment")
    points = list(prof.measured)[:2]
    calls = []
    r = fit(
        prof, ["cpu_iteration_ms"], points=points, loo=True, on_simulation=lambda d, e: calls.append((d, e))
    )
    assert [d for d, _ in calls] == list(range(1, r.evaluations + 1))
    assert all(e >= d for d, e in calls) and calls[0][1] > 1
    assert r.evaluations <= max_simulations(["cpu_iteration_ms"], points, True)


def test_validate_bar_counts_every_point(capsys):
    n = len(load_profile("rtx-pro-6000-sglang-deployment").measured)
    try:
        main(["validate", "--progress"])
    except SystemExit:
        pass
    err = capsys.readouterr().err
    assert f"{n}/{n}" in err and "validate" in err


def test_no_bar_when_not_asked_off_a_terminal(capsys):
    try:
        main(["validate"])
    except SystemExit:
        pass
    assert "validate:" not in capsys.readouterr().err

"""Progress with an ETA: the units a command reports add up to the total its bar was
given (so the ETA is about the real remaining work), and bars go to stderr, only when
asked for or on a terminal."""

from pipesim.calibrate.fit import fit, solves
from pipesim.cli import main
from pipesim.profiles.profile import load_profile


def test_fit_reports_each_solve():
    prof = load_profile("rtx-pro-6000-sglang-deployment")
    points = list(prof.measured)[:2]
    calls = []
    fit(prof, ["cpu_iteration_ms"], points=points, loo=True, on_solve=lambda: calls.append(1))
    assert len(calls) == solves(points, True) == 1 + len(points)
    assert solves(points, False) == 1


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

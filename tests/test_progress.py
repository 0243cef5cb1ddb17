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


def test_a_prediction_tells_its_progress_up_to_what_it_ran():
    """The run's progress callable sees every finished request; its expectation is the
    stopping rule's target, then the cap (never below what has finished), so the bar's
    ETA is never too early."""
    from pipesim.scenario.build import build_scenario
    from pipesim.sim.runner import simulate

    sc = build_scenario(tp=2, pp=2, concurrency=8, model="llama-3.1-8b", input_len="64", output_len="16:48")
    seen = []
    _, r = simulate(sc, progress=lambda done, expected: seen.append((done, expected)))
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == r.completed_requests + 8  # the warm-up's 8 too
    assert all(e >= d for d, e in seen)
    target = 8 + max(2 * 8, 16)
    assert seen[0][1] == target  # before the target: the target
    past = [e for d, e in seen if d >= target and e > target]
    assert not past or max(past) <= 8 + 20 * max(2 * 8, 16)  # past it, at most the cap


def test_predict_draws_a_bar_when_asked_and_none_off_a_terminal(monkeypatch, capsys):
    import pipesim
    from pipesim.base import progress

    init = progress.RequestBar.__init__
    monkeypatch.setattr(
        progress.RequestBar, "__init__", lambda self, desc, p=None, delay=2.0: init(self, desc, p, 0.0)
    )
    kw = dict(tp=2, pp=2, conc=8, model="llama-3.1-8b", input_len="64", output_len="16")
    pipesim.predict(**kw)  # progress=None, stderr is no terminal here: no bar
    assert "simulating" not in capsys.readouterr().err
    pipesim.predict(**kw, progress=True)
    err = capsys.readouterr().err
    assert "simulating TP2xPP2 C=8" in err and "request" in err

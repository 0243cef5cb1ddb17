"""api.py is the one place a prediction is put together (build, run, intervals): every
way in (keywords, a built scenario, the trace, a sweep's row, the corpus check) gives
the same figures for the same scenario, and intervals never move them."""

import pytest

from pipesim import api
from pipesim.base.errors import UserError
from pipesim.report.uncertainty import HEADLINE
from pipesim.scenario.build import build_scenario

SMALL = dict(model="llama-3.1-8b", input_len=64, output_len=16)


@pytest.fixture(scope="module")
def scenario(profile):
    return build_scenario(tp=2, pp=2, concurrency=8, profile=profile, **SMALL)


def test_predict_is_build_then_run(profile, scenario):
    by_keywords = api.predict(2, 2, 8, profile=profile, intervals=True, **SMALL)
    built = api.run(scenario, intervals="run")
    assert by_keywords.output_throughput_tok_s == built.output_throughput_tok_s
    assert by_keywords.ttft_ms_p99 == built.ttft_ms_p99
    assert by_keywords.intervals == built.intervals
    assert list(built.intervals) == list(HEADLINE)


def test_intervals_band_the_figures_and_leave_them_alone(scenario):
    """Intervals move no simulated figure: the simulation's own values stay in
    `interval_basis["uncorrected"]`, and the headline is them times the stated
    correction of the corpus residuals (docs/uncertainty.md), inside its band."""
    plain, run, none = (api.run(scenario, intervals=how) for how in (None, "run", "none"))
    assert plain.intervals == {} and plain.interval_basis == {}
    for r in (run, none):
        raw = r.interval_basis["uncorrected"]
        assert raw["output_throughput_tok_s"] == plain.output_throughput_tok_s
        assert raw["ttft_ms_p50"] == plain.ttft_ms_p50
        factor = r.interval_basis["correction"]["throughput"]
        assert r.output_throughput_tok_s == plain.output_throughput_tok_s * factor
    v = run.output_throughput_tok_s
    assert none.output_throughput_tok_s == v
    lo, hi = run.intervals["output_throughput_tok_s"]
    assert lo < v < hi
    # "none" leaves the workload part out: a band no wider than the run's own
    n_lo, n_hi = none.intervals["output_throughput_tok_s"]
    assert lo <= n_lo <= v <= n_hi <= hi
    assert none.interval_basis["workload_method"] == "none"
    assert run.interval_basis["workload_method"] == "run"


def test_an_unknown_interval_method_is_refused_in_one_line(scenario):
    with pytest.raises(UserError) as exc:
        api.run(scenario, intervals="always")
    assert str(exc.value) == "intervals 'always' is not one of None, 'run', 'ensemble', 'none'"


def test_simulate_hands_back_what_the_run_recorded(scenario):
    rec, r = api.simulate(scenario)
    assert (rec.pp, rec.tp, rec.clients) == (2, 2, 8)
    assert rec.window_s == r.window_s and not rec.kept  # a summary run folds its rows as it goes
    rec_full, r_full = api.simulate(scenario, record="full")
    assert rec_full.kept and r_full.output_throughput_tok_s == r.output_throughput_tok_s


def test_the_trace_keeps_every_row_at_the_predictions_figures(profile, scenario):
    obj, r = api.trace(2, 2, 8, profile=profile, **SMALL)
    assert r.output_throughput_tok_s == api.run(scenario).output_throughput_tok_s
    assert any(e["ph"] == "X" for e in obj["traceEvents"])
    assert len(obj["otherData"]["stages"]) == 2


def test_run_length_keywords_reach_the_run(scenario):
    r = api.run(scenario, warmup_requests=8, measure_requests=24, ci_target=None)
    assert r.completed_requests == 24


def test_a_sweep_row_is_the_apis_prediction(profile, scenario):
    from pipesim.explore.sweep import sweep

    row = sweep(splits=[(2, 2)], conc=[8], profile=profile, workers=1, **SMALL).iloc[0]
    r = api.run(scenario, intervals="run")
    assert row.output_throughput_tok_s == r.output_throughput_tok_s
    for m in HEADLINE:
        assert (row[f"{m}_lo"], row[f"{m}_hi"]) == r.intervals[m]


def test_python_sees_what_the_command_line_prints(profile, capsys):
    """One headline wherever it is read (docs/uncertainty.md): pipesim.predict's default is
    the command line's (intervals on, the corrected headline with its band), and
    intervals=False is --no-intervals (the simulation's own figures, no band)."""
    from pipesim.cli import main
    from pipesim.report.table import table

    args = ["--tp", "2", "--pp", "2", "--conc", "8", "--profile", profile.name]
    args += ["--model", "llama-3.1-8b", "--input-len", "64", "--output-len", "16"]
    for extra, kw in (([], {}), (["--no-intervals"], {"intervals": False})):
        main(["predict", *args, *extra])
        printed = capsys.readouterr().out
        r = api.predict(2, 2, 8, profile=profile.name, **SMALL, **kw)
        assert printed.strip() == table(r).strip().replace(
            f"{r.sim_wall_s:.2f} s", printed.split()[-2] + " s"
        )
        assert bool(r.intervals) == (not kw)
    assert "no band (intervals off)" in printed


def test_a_result_prints_short_and_shows_as_a_table(profile):
    r = api.predict(2, 2, 8, profile=profile, **SMALL)
    lo, hi = r.intervals["output_throughput_tok_s"]
    line = str(r)
    assert "\n" not in line and len(line) < 300 and repr(r) == f"<pipesim Result {line}>"
    assert f"{r.output_throughput_tok_s:,.1f} tok/s (likely {lo:,.0f}-{hi:,.0f})" in line
    page = r._repr_html_()
    assert page.startswith("<div>") and page.count("<tr>") == 7  # a header and six headline numbers
    assert f"{r.tpot_ms_p99:,.1f}" in page and "likely" in page
    bare = api.predict(2, 2, 8, profile=profile, intervals=False, **SMALL)
    assert "no band (intervals=False)" in str(bare) and "likely " not in str(bare)

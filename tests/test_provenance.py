"""Provenance of every cost (costs.py) and refusing a profile measured elsewhere (scenario.py)."""

import pytest

import pipesim
from pipesim.base.errors import PipesimWarning, UserError
from pipesim.costs.provenance import PROVENANCE

SMALL = dict(model="llama-3.1-8b", input_len="16", output_len="8", concurrency=2)


def test_shares_cover_every_provenance_and_sum_to_one(profile):
    r = pipesim.predict(
        tp=2,
        pp=2,
        profile=profile,
        ci_target=None,
        measure_requests=4,
        **{k: v for k, v in SMALL.items() if k != "concurrency"},
        conc=2,
        intervals=False,
    )
    assert list(r.provenance_shares) == list(PROVENANCE)
    assert sum(r.provenance_shares.values()) == pytest.approx(1.0)
    assert r.provenance_shares["borrowed"] == 0.0  # the profile was measured on this box with this engine
    assert r.provenance_shares["roofline"] > 0.0  # norms, rope, activations have no table


def test_foreign_profile_is_refused_then_borrowed(profile):
    with pytest.raises(UserError, match="engine sglang vs vllm"):
        pipesim.build_scenario(profile=profile, engine="vllm", **SMALL)
    with pytest.warns(PipesimWarning, match="borrowing profile .* its costs are reported as borrowed"):
        sc = pipesim.build_scenario(profile=profile, engine="vllm", allow_foreign_profile=True, **SMALL)
    r = pipesim.run(sc, ci_target=None, measure_requests=4)
    shares = r.provenance_shares
    # every table cost is borrowed; only the roofline's own estimates stay roofline
    assert shares["measured"] == shares["interpolated"] == shares["extrapolated"] == 0.0
    assert shares["borrowed"] > 0.5 and shares["borrowed"] + shares["roofline"] == pytest.approx(1.0)
    assert r.scenario["profile_foreign"] == "engine sglang vs vllm"


def test_profile_names_the_defaults():
    # the vLLM profile's own box, engine and model are the defaults (profile.toml: model = "kimi-k2.6")
    sc = pipesim.build_scenario(
        profile="rtx-pro-6000-vllm", tp=8, concurrency=1, input_len="16", output_len="8"
    )
    assert (sc.box.name, sc.settings.describe()["engine"], sc.model.name) == (
        "rtx-pro-6000-server-8x",
        "vllm",
        "kimi-k2.6",
    )


def test_engine_alone_picks_the_boxs_profile_for_that_engine():
    sc = pipesim.build_scenario(engine="vllm", **SMALL)
    assert sc.profile.name == "rtx-pro-6000-vllm"


def test_box_without_tables_is_first_principles():
    sc = pipesim.build_scenario(box="l4-8x", tp=1, **SMALL)
    assert sc.profile.name == "first-principles-l4-8x" and not sc.profile.tables
    r = pipesim.run(sc, ci_target=None, measure_requests=4)
    assert r.provenance_shares["roofline (fitted)"] == pytest.approx(1.0)  # TP1: kernels only, fitted curves


def test_the_command_line_prints_the_warning_as_one_line(capsys):
    from pipesim.cli import main

    args = [
        "predict",
        "--profile",
        "rtx-pro-6000-sglang-healthy",
        "--engine",
        "vllm",
        "--allow-foreign-profile",
    ]
    main([*args, "--tp", "8", "--conc", "1", "--input-len", "16", "--output-len", "8"])
    err = capsys.readouterr().err
    assert err.count("pipesim: warning: borrowing profile rtx-pro-6000-sglang-healthy (") == 1

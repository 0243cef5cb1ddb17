"""Knob resolution tells where each value came from (docs/engines.md §7).

SGLang's `Scheduler.__init__` (python/sglang/srt/managers/scheduler.py) derives
`pp_max_micro_batch_size = max(max_running_requests // pp_size, 1)` when the flag is
not given, so a profile's deployment cap must not survive a user's own
`--max-running-requests`."""

import pipesim
from pipesim.report import table

DEPLOYMENT = (
    "rtx-pro-6000-sglang-deployment"  # launched with --max-running-requests 64 --pp-max-micro-batch-size 64
)


def test_profile_deployment_flags_stand_in_for_knobs_not_given():
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=64, profile=DEPLOYMENT)
    assert sc.settings.max_running_requests == 64 and sc.settings.pp_max_micro_batch_size == 64
    assert sc.knob_sources["max_running_requests"] == "profile deployment"
    assert sc.knob_sources["pp_max_micro_batch_size"] == "profile deployment"
    assert sc.knob_sources["chunked_prefill_size"] == "engine default"


def test_mrr_alone_rederives_the_cap_as_sglang_does():
    # the README's pathology example: --max-running-requests 64 at PP8 -> 64 // 8 = 8 per slot
    sc = pipesim.build_scenario(tp=1, pp=8, concurrency=64, max_running_requests=64, profile=DEPLOYMENT)
    assert sc.settings.pp_max_micro_batch_size == 8
    assert sc.knob_sources["max_running_requests"] == "user"
    assert sc.knob_sources["pp_max_micro_batch_size"] == "engine default"
    # other deployment flags still apply
    assert sc.knob_sources["pp_async_batch_depth"] == "profile deployment"


def test_both_given_are_the_users():
    sc = pipesim.build_scenario(
        tp=1, pp=8, concurrency=64, max_running_requests=64, pp_max_micro_batch_size=16, profile=DEPLOYMENT
    )
    assert sc.settings.pp_max_micro_batch_size == 16
    assert sc.knob_sources["pp_max_micro_batch_size"] == "user"


def test_other_engine_takes_no_deployment_flag():
    # an SGLang deployment's flags are not vLLM's (the profile is refused unless borrowed)
    sc = pipesim.build_scenario(
        tp=2, pp=4, concurrency=8, engine="vllm", profile=DEPLOYMENT, allow_foreign_profile=True
    )
    assert set(sc.knob_sources.values()) == {"engine default"}


def test_sources_in_json_and_table():
    r = pipesim.predict(
        tp=1,
        pp=8,
        conc=4,
        max_running_requests=64,
        profile=DEPLOYMENT,
        output_len="8",
        warmup_requests=4,
        measure_requests=4,
    )
    assert r.to_dict()["scenario"]["knob_sources"]["pp_max_micro_batch_size"] == "engine default"
    line = table(r).splitlines()[2]
    assert "max_running_requests 64 [user]" in line and "per-slot cap 8 [default]" in line

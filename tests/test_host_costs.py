"""The host loop's arithmetic (costs/host.py) and its defaults (pipesim/data/host_loop.toml,
profiles/hostloop.py), against figures worked by hand from docs/host-loop.md §4-§6."""

import math
from pathlib import Path

import pytest

import pipesim
from pipesim.base.errors import PipesimWarning, UserError
from pipesim.costs import host
from pipesim.inputs.model import load_model
from pipesim.profiles import hostloop
from pipesim.profiles.profile import FITTABLE, HOST_PARAMS, Params

F = 1.68  # the H200 host's factor (docs/host-loop.md §5.7), the default host_cpu_factor


def test_every_term_of_every_release_has_a_value_and_a_source():
    for engine in ("sglang", "vllm"):
        for era in hostloop.eras(engine):
            assert set(HOST_PARAMS) <= set(era.params)
            assert all(era.sources[k].strip() for k in era.params)
    assert set(hostloop.kernels()) == set(hostloop.kernel_sources())


def test_every_cost_term_is_fittable():
    counts = ("piecewise_kernels_decode", "piecewise_kernels_mixed")  # structure, not a cost
    assert set(HOST_PARAMS) - set(counts) <= set(FITTABLE)


def test_the_release_picks_the_block_of_defaults():
    assert hostloop.era("vllm", "0.5.3.post1").params["out_step_per_req_us"] == 33.9  # API server in-process
    assert hostloop.era("vllm", "0.6.3.post1").params["out_step_per_req_us"] == 24.0
    assert hostloop.era("vllm", "0.7.3").params["sched_per_req_us"] == 12.37  # still V0
    v1 = hostloop.era("vllm", "0.10.1.1").params
    assert (
        v1["sched_per_req_us"] == 7.87
        and v1["out_step_per_req_us"] == 0
        and v1["piecewise_kernels_decode"] == 2
    )
    assert hostloop.era("vllm", "0.11.0").params["piecewise_kernels_decode"] == 0
    assert hostloop.era("sglang", "0.5.14").params["detokenize_token_us"] == 11.0


@pytest.mark.parametrize(
    "engine, version",
    [("vllm", "0.4.2"), ("vllm", "0.35.0"), ("vllm", "abc"), ("sglang", "0.3.3"), ("sglang", "0.6.0")],
)
def test_a_release_not_modelled_is_one_line_naming_those_that_are(engine, version):
    with pytest.raises(UserError) as exc:
        hostloop.check_version(engine, version)
    text = str(exc.value)
    assert "\n" not in text and f"--engine-version '{version}'" in text
    first, last, _ = hostloop.modelled(engine)
    assert f"pipesim models {engine} {first} to {last}.x" in text


def test_step_terms_by_hand():
    p = Params(
        host_cpu_factor=2.0,
        sched_base_us=10,
        sched_per_req_us=3,
        sched_per_prefill_token_us=0.5,
        prep_base_us=20,
        prep_per_req_us=1,
        out_step_base_us=4,
        out_step_per_req_us=2,
        tp_bcast_base_us=50,
        tp_bcast_per_rank_us=10,
    )
    h = host.step_host(p, requests=8, prefill_tokens=100, tp=4)
    assert h.sched_s == pytest.approx((10 + 3 * 8 + 0.5 * 100) * 2e-6)
    assert h.prep_s == pytest.approx((20 + 8) * 2e-6)
    assert h.out_step_s == pytest.approx((4 + 2 * 8) * 2e-6)
    assert h.bcast_s == pytest.approx((50 + 10 * 3) * 2e-6)
    assert host.bcast_s(p, 1) == 0.0  # one rank broadcasts to no one
    assert h.cpu_step_s == pytest.approx(h.sched_s + h.prep_s + h.bcast_s)


def test_kernels_per_layer_by_family_and_tp():
    """docs/host-loop.md §4.2: a Llama layer launches about 10 kernels at TP1 and 12 at
    TP > 1; an MLA + MoE layer with a shared expert 12 + 9 + 4 (+ 2 at TP > 1)."""
    llama = load_model("llama-3.1-8b")
    assert host.layer_kernels(llama, 0, 1) == 10 and host.layer_kernels(llama, 0, 2) == 12
    kimi = load_model("kimi-k2.6")
    moe_layer = next(i for i in range(kimi.num_layers) if kimi.is_moe_layer(i))
    assert host.layer_kernels(kimi, moe_layer, 8) == 12 + 9 + 4 + 2
    assert host.layer_kernels(kimi, 0, 8) == 12 + 4 + 2  # its first layers are dense


def test_eager_launch_by_hand_and_a_deployments_own_figure_wins():
    llama = load_model("llama-3.1-8b")
    p = Params(host_cpu_factor=F, launch_us_per_kernel=14.9)
    eager = host.launch_s(p, llama, range(32), 1, last=True, graphed=False, prefill=False)
    assert eager == pytest.approx((32 * 10 + 10) * 14.9 * F * 1e-6)  # 8.26 ms
    assert host.launch_s(p, llama, range(32), 1, last=True, graphed=True, prefill=False) == 0.0
    piecewise = p.__class__(**{**vars(p), "piecewise_kernels_mixed": 2.0})
    assert host.launch_s(piecewise, llama, range(32), 1, True, graphed=True, prefill=True) == pytest.approx(
        32 * 2 * 14.9 * F * 1e-6
    )
    own = Params(host_cpu_factor=F, launch_us_per_kernel=14.9, eager_launch_us_per_layer=600.0)
    assert host.launch_s(own, llama, range(32), 1, True, graphed=False, prefill=False) == pytest.approx(
        32 * 600e-6
    )


def test_the_output_path_caps_tokens_per_second_at_its_slower_process():
    p = Params(host_cpu_factor=2.0, detokenize_token_us=11, stream_token_us=9.9)
    assert host.out_token_cap_tok_s(p) == pytest.approx(1 / (11 * 2e-6))
    assert math.isinf(host.out_token_cap_tok_s(Params()))
    assert host.output_path_s(p, 10) == pytest.approx((110 * 2e-6, 99 * 2e-6))


GPU, H = 5e-3, host.StepHost(sched_s=1e-3, prep_s=0.5e-3, bcast_s=0.2e-3, out_step_s=2e-3)


@pytest.mark.parametrize(
    "kw, step",
    [
        (dict(overlap=False, launch_on_loop=True), 1.7e-3 + 5e-3 + 2e-3),  # V0 sync: cpu + gpu + out
        (dict(overlap=False, launch_on_loop=True, async_output=True), 1.7e-3 + 5e-3),  # out under the GPU
        (dict(overlap=False, launch_on_loop=True, scheduler_steps=4), 1.7e-3 / 4 + 5e-3 + 2e-3),
        (dict(overlap=True, launch_on_loop=False), 5e-3),  # SGLang overlap, V1 async
    ],
)
def test_compose_is_the_table_of_docs_host_loop_6_2(kw, step):
    got = host.compose(GPU, H, 0.0, **kw)
    assert got.step_s == pytest.approx(step) and got.exposed_s == pytest.approx(step - GPU)


def test_compose_with_launches():
    """V1 sync at TP1, eager: sched + prep + max(gpu, launch); async: max(gpu, sched + prep
    + launch) since the engine core's thread launches; workers' launches stay beside it."""
    h = host.StepHost(1e-3, 0.5e-3, 0.0, 0.0)
    assert host.compose(5e-3, h, 8e-3, overlap=False, launch_on_loop=True).step_s == pytest.approx(9.5e-3)
    assert host.compose(5e-3, h, 4e-3, overlap=True, launch_on_loop=True).step_s == pytest.approx(5.5e-3)
    assert host.compose(5e-3, h, 4e-3, overlap=True, launch_on_loop=False).step_s == pytest.approx(5e-3)


def test_a_profile_s_own_values_win_and_every_default_says_where_it_came_from():
    sc = pipesim.build_scenario(concurrency=1, model="llama-3.1-8b", input_len=16, output_len=4)
    p, sources = sc.profile.params, sc.profile.meta["param_sources"]
    # the reference profile sets its CPU against the measuring one, fitted to its points
    # (calibration/profiles/rtx-pro-6000-sglang-deployment), not the H200 host's default
    assert p.host_cpu_factor != 1.68 and 1.0 < p.host_cpu_factor < 2.5
    assert "fitted to measured.csv" in sources["host_cpu_factor"]
    # and not these: SGLang 0.5.14's defaults
    assert p.sched_per_req_us == 6.57 and sources["sched_per_req_us"].startswith("host-loop default, sglang")
    assert p.detokenize_token_us == 11.0 and sources["detokenize_token_us"].startswith("host-loop default")
    assert sc.engine_version == "0.5.14" and sc.describe()["host_loop"]["from"] == "0.3.4"


def test_a_profile_of_another_engine_keeps_none_of_its_host_values():
    with pytest.warns(PipesimWarning):
        sc = pipesim.build_scenario(
            concurrency=1,
            engine="vllm",
            profile="rtx-pro-6000-sglang-deployment",
            allow_foreign_profile=True,
            model="llama-3.1-8b",
            input_len=16,
            output_len=4,
        )
    assert sc.profile.params.detokenize_token_us == 0.0 and sc.profile.params.stream_token_us == 16.9


DOC = Path(__file__).resolve().parent.parent / "docs" / "engines.md"
BEGIN = "<!-- host-loop defaults: generated from pipesim/data/host_loop.toml, do not edit by hand -->\n"
END = "<!-- end of host-loop defaults -->"


def doc_table(text: str) -> str:
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def test_the_docs_table_of_defaults_matches_the_data():
    assert doc_table(DOC.read_text()) == hostloop.markdown() + "\n"


if __name__ == "__main__":  # rewrite docs/engines.md §10's table from the data
    text = DOC.read_text()
    DOC.write_text(text.replace(BEGIN + doc_table(text) + END, BEGIN + hostloop.markdown() + "\n" + END))

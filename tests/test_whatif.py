"""What-ifs through the public API and the command line: each knob changes the cost it
names by its factor, and nothing else."""

import json

import pytest
from conftest import SHORT_LLAMA_ARGS, fast_predict

import pipesim
from pipesim.cli import main
from pipesim.inputs.box import load_box
from pipesim.scenario.build import build_scenario

FAST = dict(model="llama-3.1-8b", input_len="64", output_len="40")


def test_knobs_scale_the_profile_and_the_box(profile):
    base = build_scenario(tp=2, pp=2, concurrency=4, profile=profile, **FAST)
    sc = build_scenario(
        tp=2,
        pp=2,
        concurrency=4,
        profile=profile,
        kernel_scale=0.5,
        allreduce_scale=3.0,
        pcie_bandwidth_scale=2.0,
        cpu_iteration_ms=1.25,
        **FAST,
    )
    p, q = base.profile.params, sc.profile.params
    assert q.kernel_scale == pytest.approx(0.5 * p.kernel_scale)
    assert q.allreduce_scale == pytest.approx(3.0 * p.allreduce_scale)
    assert q.cpu_iteration_ms == 1.25 and q.allreduce_offset_us == p.allreduce_offset_us
    box = load_box(profile.box)  # the TOML's own numbers
    assert [link.bw_bytes_s for link in sc.box.links] == [2.0 * link.bw_bytes_s for link in box.links]
    assert sc.describe()["whatif"] == {
        "kernel_scale": 0.5,
        "allreduce_scale": 3.0,
        "pcie_bandwidth_scale": 2.0,
        "cpu_iteration_ms": 1.25,
    }
    assert "whatif" not in base.describe()


def test_half_the_kernel_time_halves_the_compute_per_token(profile):
    """GPU compute seconds per output token = compute share / output tok/s; every kernel
    taking half its time halves it (same batches at C=1: one request, one token a step).
    The CPU's eager launch time (prefill runs without a CUDA graph) is not a kernel's
    and does not scale: it is set to 0 here so that every GPU second is kernel time."""
    profile = profile.with_params(eager_launch_us_per_layer=0.0)
    kw = dict(tp=1, pp=1, conc=1, measure_requests=8, **FAST)
    a = fast_predict(profile, **kw)
    b = fast_predict(profile, kernel_scale=0.5, **kw)
    per_token = lambda r: r.time_shares["compute"] / r.output_throughput_tok_s  # noqa: E731
    assert per_token(b) == pytest.approx(0.5 * per_token(a), rel=0.02)


def test_whatif_returns_base_and_changed(profile):
    base, changed = pipesim.whatif(
        dict(tp=2, pp=1, conc=2, profile=profile, ci_target=None, **FAST), allreduce_scale=4.0
    )
    assert changed.allreduce_share > base.allreduce_share  # 4x the collective time
    assert changed.output_throughput_tok_s < base.output_throughput_tok_s
    with pytest.raises(pipesim.UserError, match="unknown what-if 'warp'"):
        pipesim.whatif(dict(tp=1, conc=1), warp=2.0)


def test_cli_flags_and_engine_aliases(capsys):
    main(
        [
            "predict",
            "--tensor-parallel-size",
            "2",
            "--pipeline-parallel-size",
            "2",
            "--max-concurrency",
            "2",
            "--kernel-scale",
            "0.5",
            "--pcie-bandwidth-scale",
            "2",
            *SHORT_LLAMA_ARGS,
            "--json",
        ]
    )
    d = json.loads(capsys.readouterr().out)
    assert (d["scenario"]["tp"], d["scenario"]["pp"], d["scenario"]["workload"]["concurrency"]) == (2, 2, 2)
    assert d["scenario"]["whatif"] == {"kernel_scale": 0.5, "pcie_bandwidth_scale": 2.0}
    main(
        [
            "predict",
            "--tp-size",
            "2",
            "--pp-size",
            "1",
            "--request-rate",
            "1",
            "--num-requests",
            "5",
            *SHORT_LLAMA_ARGS,
            "--json",
        ]
    )
    d = json.loads(capsys.readouterr().out)
    assert d["scenario"]["tp"] == 2 and d["scenario"]["workload"]["rate_rps"] == 1.0


def test_profiles_show_prints_the_folder(capsys):
    from pipesim.profiles.profile import profile_folder

    main(["profiles", "show", "rtx-pro-6000-vllm"])
    out = capsys.readouterr().out
    folder = profile_folder("rtx-pro-6000-vllm")
    assert f"folder {folder}" in out and (folder / "profile.toml").is_file()

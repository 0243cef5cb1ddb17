"""The cost model, against the raw measured tables (physics.md §4, §5) and by-hand
formulas (physics.md §2 for distinct experts and all-reduces per layer)."""

import dataclasses

import pandas as pd
import pytest
from conftest import without_tables

from pipesim.costs.primitives import Shape, distinct_experts
from pipesim.costs.stage import CostModel
from pipesim.inputs.box import load_box
from pipesim.inputs.plan import make_plan
from pipesim.profiles.tables import Tables

BOX = "rtx-pro-6000-server-8x"


@pytest.fixture(scope="module")
def box():
    return load_box(BOX)


def cost_model(box, model, profile, tp, pp):
    return CostModel(box, model, make_plan(tp, pp, model.num_layers, 8, "sglang"), profile)


def raw_mean(raw_dir, stem, **where) -> float:
    """Mean latency (ms) of the raw rows matching `where` (the source repeats some rows)."""
    df = pd.read_csv(raw_dir / f"{stem}.csv.gz")
    for col, val in where.items():
        df = df[df[col] == val]
    assert len(df) >= 1, f"no raw row {where}"
    return float(df["latency"].mean())


def test_profile_is_neutral_for_collectives(profile):
    # the healthy profile takes the NCCL table as measured (scale 1, offset 0): the
    # comparisons below rely on it and state it
    assert profile.params.allreduce_scale == 1.0 and profile.params.allreduce_offset_us == 0.0


# ---- measured tables ----------------------------------------------------------------


def test_gemm_at_grid_point_is_the_measurement(profile, kimi, box):
    cm = cost_model(box, kimi, profile, 1, 1)
    t, source = cm.gemm(1, 7168, 7168, "bf16")
    assert source == "measured"  # read at a measured point
    # physics.md §5 / brief: sglang_torch_linear bfloat16 m=1 n=7168 k=7168: 0.0702071 ms
    assert t == pytest.approx(0.0702071e-3, rel=1e-5)


@pytest.mark.parametrize("m,n,k", [(1, 7168, 7168), (8, 7168, 7168), (64, 7168, 7168)])
def test_gemm_matches_raw_table(profile, kimi, box, raw_dir, m, n, k):
    expected_ms = raw_mean(
        raw_dir, "gemm_perf", kernel_source="sglang_torch_linear", gemm_dtype="bfloat16", m=m, n=n, k=k
    )
    t, source = cost_model(box, kimi, profile, 1, 1).gemm(m, n, k, "bf16")
    assert source == "measured"  # read at a measured point
    assert t == pytest.approx(expected_ms * 1e-3, rel=1e-5)


def test_gemm_between_grid_points_is_bracketed(profile, kimi, box):
    cm = cost_model(box, kimi, profile, 1, 1)
    lo, hi = cm.gemm(1, 7168, 7168, "bf16")[0], cm.gemm(2, 7168, 7168, "bf16")[0]
    mid = cm.gemm(1.5, 7168, 7168, "bf16")[0]
    assert min(lo, hi) <= mid <= max(lo, hi)
    assert cm.gemm(1.5, 7168, 7168, "bf16")[1] == "interpolated"
    m_max = max(c.xs[-1] for c in profile.gemm["bf16"][2].values())
    assert cm.gemm(2 * m_max, 7168, 7168, "bf16")[1] == "extrapolated"  # beyond the largest measured m


@pytest.mark.parametrize("tp", [1, 8])  # a whole layer on one GPU (PP), and TP8
def test_moe_int4_kimi_one_token_matches_raw(profile, kimi, box, raw_dir, tp):
    dist = profile.params.moe_distribution
    expected_ms = raw_mean(
        raw_dir,
        "moe_perf",
        kernel_source="sglang_marlin_moe",
        moe_dtype="int4_wo",
        num_tokens=1,
        hidden_size=7168,
        inter_size=2048,
        topk=8,
        num_experts=384,
        moe_tp_size=tp,
        moe_ep_size=1,
        distribution=dist,
    )
    t, source = cost_model(box, kimi, profile, tp, 1).moe(1, tp)
    assert source == "measured"  # read at a measured point
    assert t == pytest.approx(expected_ms * 1e-3, rel=1e-5)


@pytest.mark.parametrize("elements", [8192, 65536, 262144, 1048576])
def test_nccl_allreduce_8_gpus_matches_raw(profile, kimi, box, raw_dir, elements):
    # message_size counts elements of half (2 bytes) (physics.md §4)
    expected_ms = raw_mean(
        raw_dir,
        "nccl_perf",
        op_name="all_reduce",
        kernel_source="NCCL",
        nccl_dtype="half",
        num_gpus=8,
        message_size=elements,
    )
    cm = cost_model(box, kimi, profile, 8, 1)
    t, source = cm.collective("all_reduce", tuple(range(8)), elements * 2)
    assert source == "measured"  # read at a measured point
    p = profile.params
    assert t == pytest.approx(expected_ms * 1e-3 * p.allreduce_scale + p.allreduce_offset_us * 1e-6, rel=1e-5)


def test_nccl_allreduce_reference_figures(profile, kimi, box):
    # physics.md §4: 8-GPU all-reduce ~25 us up to 16 K elements, 48 us at 64 K, 221 us at 1 M
    cm = cost_model(box, kimi, profile, 8, 1)
    g = tuple(range(8))
    assert cm.allreduce_time(g, 16384 * 2) * 1e6 == pytest.approx(29, abs=5)
    assert cm.allreduce_time(g, 65536 * 2) * 1e6 == pytest.approx(48, abs=2)
    assert cm.allreduce_time(g, 1048576 * 2) * 1e6 == pytest.approx(221, abs=2)


def test_collective_on_one_gpu_is_free(profile, kimi, box):
    cm = cost_model(box, kimi, profile, 1, 1)
    assert cm.collective("all_reduce", (0,), 1e6)[0] == 0.0


# ---- distinct experts and the MoE roofline ---------------------------------------------


@pytest.mark.parametrize("tokens,expected", [(1, 8), (8, 60), (32, 188), (64, 284)])
def test_distinct_experts_reference(tokens, expected):
    # physics.md §2: E x (1 - (1 - k/E)^B) = 8, 60, 188, 284 at B = 1, 8, 32, 64
    assert distinct_experts(tokens, 384, 8) == pytest.approx(expected, abs=1)


def test_distinct_experts_bounded():
    assert distinct_experts(1, 384, 8) == pytest.approx(8)
    assert distinct_experts(10_000, 384, 8) <= 384
    assert distinct_experts(10_000, 384, 8) == pytest.approx(384, rel=1e-6)


@pytest.fixture(scope="module")
def no_moe_profile(profile):
    """The shipped profile without its MoE table (a new object: lookups are cached)."""
    return without_tables(profile, "moe")


def test_roofline_moe_by_hand(no_moe_profile, kimi, box):
    cm = cost_model(box, kimi, no_moe_profile, 1, 1)
    floor = no_moe_profile.params.kernel_floor_us * 1e-6
    expert_bytes = 3 * 7168 * 2048 * 4.5 / 8
    for tokens in (1, 64):
        t, source = cm.moe(tokens, 1)
        assert source == "roofline"
        touched = 384 * (1 - (1 - 8 / 384) ** tokens)
        nbytes = touched * expert_bytes + 2 * tokens * 7168 * 2  # weights + activations in/out
        flops = 2 * tokens * 8 * 3 * 7168 * 2048
        expected = max(nbytes / box.gpu.mem_bw_bytes_s, flops / box.gpu.flops_bf16) + floor
        assert t == pytest.approx(expected, rel=1e-9)


def test_roofline_moe_grows_with_distinct_experts(no_moe_profile, kimi, box):
    cm = cost_model(box, kimi, no_moe_profile, 1, 1)
    floor = no_moe_profile.params.kernel_floor_us * 1e-6
    times = [cm.moe(b, 1)[0] for b in (1, 8, 32, 64, 256)]
    assert all(a < b for a, b in zip(times, times[1:]))
    # memory-bound at decode sizes: time above the floor scales with the experts touched
    ratio = (times[3] - floor) / (times[1] - floor)
    assert ratio == pytest.approx(distinct_experts(64, 384, 8) / distinct_experts(8, 384, 8), rel=0.01)
    # far from linear in tokens (64x the tokens, ~35x the time)
    assert (times[3] - floor) / (times[0] - floor) < 64 * 0.6


def test_roofline_moe_split_over_tp(no_moe_profile, kimi, box):
    floor = no_moe_profile.params.kernel_floor_us * 1e-6
    t1 = cost_model(box, kimi, no_moe_profile, 1, 1).moe(8, 1)[0] - floor
    t8 = cost_model(box, kimi, no_moe_profile, 8, 1).moe(8, 8)[0] - floor
    # weight bytes are split 8 ways; activations are not (a small term)
    assert t8 == pytest.approx(t1 / 8, rel=0.01)


# ---- a stage -------------------------------------------------------------------------


def test_tp8_stage_allreduces(profile, kimi, box):
    cm = cost_model(box, kimi, profile, 8, 1)
    shape = Shape(decode=1, decode_ctx=300)
    ops = cm.stage_ops(0, shape)
    ar = [o for o in ops if o.kind == "tp_comm" and "all-reduce" in o.name]
    # physics.md §4: 2 all-reduces per layer (after o_proj, after MoE + shared expert),
    # 122 for Kimi's 61 layers, plus one at the embedding
    assert sum(o.count for o in ar) == 2 * 61 + 1
    per_ar = cm.allreduce_time(tuple(range(8)), 1 * 7168 * 2)  # one token's hidden state, bf16
    assert per_ar > 0
    assert all(o.seconds == pytest.approx(per_ar) for o in ar)
    compute, comm = cm.stage_time(0, shape)
    assert compute > 0
    assert comm >= (2 * 61 + 1) * per_ar * (1 - 1e-9)
    # everything else counted as TP communication is the logits all-gather (one)
    other = [o for o in ops if o.kind == "tp_comm" and o not in ar]
    assert sum(o.count for o in other) <= 1
    assert comm == pytest.approx(sum(o.seconds * o.count for o in ops if o.kind == "tp_comm"))


def test_pp_stages_have_no_allreduce(profile, kimi, box):
    cm = cost_model(box, kimi, profile, 1, 8)
    for s in range(8):
        compute, comm = cm.stage_time(s, Shape(decode=4, decode_ctx=300))
        assert compute > 0 and comm == 0.0
        assert not [o for o in cm.stage_ops(s, Shape(decode=4, decode_ctx=300)) if o.kind == "tp_comm"]


def test_embedding_first_stage_lm_head_last(profile, kimi, box):
    # physics.md §6: embedding on stage 0, lm_head + sampling on the last
    cm = cost_model(box, kimi, profile, 1, 8)
    names = [{o.name for o in cm.stage_ops(s, Shape(decode=1, decode_ctx=300))} for s in range(8)]
    assert any("embedding" in n for n in names[0])
    assert not any("embedding" in n for s in range(1, 8) for n in names[s])
    assert any("lm_head" in n for n in names[7])
    assert not any("lm_head" in n for s in range(7) for n in names[s])


def test_stage_layers_counted(profile, kimi, box):
    # a stage's per-layer ops occur once per layer it holds (7 or 8 on PP8)
    cm = cost_model(box, kimi, profile, 1, 8)
    for s, n in enumerate((7, 7, 7, 8, 8, 8, 8, 8)):
        ops = {o.name: o for o in cm.stage_ops(s, Shape(decode=1, decode_ctx=300))}
        assert ops["o proj"].count == n
        # stage 0 holds the dense layer 0, the others only MoE layers
        moe = ops["routed experts"].count
        assert moe == (n - 1 if s == 0 else n)


def test_stage_time_grows_with_batch(profile, kimi, box):
    cm = cost_model(box, kimi, profile, 2, 4)
    t = [sum(cm.stage_time(1, Shape(decode=b, decode_ctx=500))) for b in (1, 8, 64)]
    assert t[0] < t[1] < t[2]


def test_hop_time_tp1_is_p2p(profile, kimi, box):
    # TP1: one rank sends the whole activation along the PCIe path; no all-gather
    cm = cost_model(box, kimi, profile, 1, 8)
    nbytes = 2 * 7168 * 2  # hidden + residual, one token, bf16 (physics.md §2: 28 KiB)
    hop_cpu = profile.params.cpu_hop_ms * 1e-3
    assert cm.hop_time(0, 1, nbytes) == pytest.approx(box.p2p_time_s(0, 1, nbytes) + hop_cpu)
    assert cm.hop_time(3, 4, nbytes) == pytest.approx(box.p2p_time_s(3, 4, nbytes) + hop_cpu)


def test_replaced_tables_are_indexed_afresh(profile):
    # a profile given other tables builds its own lookups; with_params shares them
    p2 = dataclasses.replace(profile, tables=Tables({k: v for k, v in profile.tables.items() if k != "moe"}))
    assert p2.moe == {} and profile.moe != {}
    p3 = profile.with_params(cpu_iteration_ms=1.0)
    assert p3.tables is profile.tables and p3.params.cpu_iteration_ms == 1.0


@pytest.fixture(scope="module")
def no_collective_profile(profile):
    """The shipped profile without its collective table: TP collectives by the ring model."""
    return without_tables(profile, "collectives")


@pytest.mark.parametrize("slow_bw", [20e9, None])
def test_stage_time_cache_keeps_rings_apart(no_collective_profile, llama8, box, slow_bw):
    """TP2 x PP4 on Llama-8B: stages 1 (GPUs 2, 3) and 2 (GPUs 4, 5) have the same
    layers. With GPUs 2 and 3 on slower links their ring is narrower, so under the
    ring model their collectives take longer; the cached stage time must be the one
    composed from the stage's own operations, whichever stage asked first. With
    equal links the two stages take equal times."""
    b = (
        box
        if slow_bw is None
        else dataclasses.replace(
            box,
            links=tuple(
                dataclasses.replace(ln, bw_bytes_s=slow_bw) if ln.child in ("gpu2", "gpu3") else ln
                for ln in box.links
            ),
        )
    )
    cm = cost_model(b, llama8, no_collective_profile, 2, 4)
    shape = Shape(decode=8, decode_ctx=512)
    t2, t1 = cm.stage_time(2, shape), cm.stage_time(1, shape)  # stage 2 fills the cache first
    for s, t in ((1, t1), (2, t2)):
        ops = cm.stage_ops(s, shape)
        assert t[1] == pytest.approx(sum(o.seconds * o.count for o in ops if o.kind == "tp_comm"), rel=1e-12)
    if slow_bw is None:
        assert t1 == t2
    else:
        assert t1[1] > t2[1] and t1[0] == pytest.approx(t2[0])


# ---- attention after a prefix (a chunked prompt's later chunks) ------------------------------


def test_a_chunk_after_a_prefix_costs_the_whole_prompt_of_equal_work(profile, llama8, box):
    """A chunk of c tokens after p cached ones does c (p + c / 2) causal work, a whole
    prompt of n tokens n^2 / 2: within the table the chunk is read at n = sqrt(c (c + 2p)).
    8 tokens after 248 (vLLM's remainder of a prompt split at the token budget): n = 63.5,
    so it costs between the measured 32- and 64-token prompts, less than the whole
    256-token prompt it finishes (the work ratio 63x the 8-token kernel's time was 40x
    that prompt)."""
    cm = cost_model(box, llama8, profile, 1, 1)
    prompt = profile.gqa_prefill[(32, 8, 128)]
    t, _ = cm.attention_prefill(8, 248, 1)
    assert t == pytest.approx(prompt(1, (8 * (8 + 2 * 248)) ** 0.5) * 1e-3, rel=1e-12)
    assert prompt(1, 32) * 1e-3 <= t <= prompt(1, 64) * 1e-3
    assert t < cm.attention_prefill(256, 0, 1)[0]
    # a whole prompt (no prefix) is the table's, as before
    assert cm.attention_prefill(256, 0, 1)[0] == pytest.approx(prompt(1, 256) * 1e-3, rel=1e-12)


def test_a_chunk_after_a_prefix_grows_with_the_prefix(profile, llama8, box):
    cm = cost_model(box, llama8, profile, 1, 1)
    times = [cm.attention_prefill(512, p, 1)[0] for p in (0, 512, 4096, 60_000, 200_000)]
    assert times == sorted(times) and len(set(times)) == len(times)

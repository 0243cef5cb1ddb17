"""The KV pool as the engines size it (engines/reserve.py, inputs/activations.py,
docs/engines.md §9), worked by hand from the engines' rules and the models' cards.

Llama-3.1-70B (meta-llama config.json): 80 layers, hidden 8192, 64 query and 8 KV heads
of 128, SwiGLU of 28672, vocab 128256, untied, bf16:
- parameters per layer: attention 8192 x (64 + 16) x 128 + 64 x 128 x 8192 = 150,994,944,
  MLP 3 x 8192 x 28672 = 704,643,072; with the embedding and lm_head 70,552,387,584;
- KV per token: 80 layers x 8 heads x 128 x 2 (K, V) x 2 bytes = 327,680 B (at TP 1).
"""

import json
from importlib import resources

import pytest

import pipesim
from pipesim.base.errors import UserError
from pipesim.cli import main
from pipesim.engines.sglang import SGLangConfig
from pipesim.engines.vllm import VLLMConfig
from pipesim.inputs.activations import forward_peak_bytes
from pipesim.inputs.box import load_box
from pipesim.inputs.model import from_hf_config, load_model
from pipesim.inputs.plan import make_plan

GiB, MiB = 2**30, 2**20
H200 = 150_754_820_096  # the h200-1x box: 143,771 MiB
H100 = 80 * GiB  # h100-sxm-4x
LAYER = 150_994_944 + 704_643_072
LLAMA70_BYTES = 2 * (80 * LAYER + 2 * 128256 * 8192)  # 141,104,775,168 B = 131.4 GiB
KV_PER_TOKEN = 80 * 8 * 128 * 2 * 2
CONTEXT = 1.15 * GiB  # engines/reserve.py: SGLang's start-up logs, context + libraries
NVLINK_COMM = 2.01 * GiB  # the same logs, TP8 over NVLink
# vLLM's profile run on a GPU of 70 GiB or more (get_batch_defaults: 1024 sequences, 8192
# tokens): a forward of N = 8192 tokens, then the sampler over min(1024, 8192) = 1024 rows:
# the hidden states kept, and 28 bytes per logit with the PyTorch sort, 14 with a top-k/top-p
# kernel (vLLM 0.11.0, and from 0.19)
N, ROWS = 8192, 1024
HIDDEN = 2 * (N + 2 * ROWS) * 8192
SORT = HIDDEN + ROWS * 128256 * 28
KERNEL = HIDDEN + ROWS * 128256 * 14
NON_TORCH = 0.07 * GiB
# vLLM >= 0.21 with graphs: 51 capture sizes up to min(2 x 1024, 512, 8192) = 512 ([1, 2, 4],
# 8..248 by 8, 256..512 by 16), each piecewise and (all <= 1024 sequences) full: 102 graphs
# of 23 MiB, plus the largest graph's forward at 512 tokens
GRAPH_COUNT = 2 * (3 + 31 + 17)


def forward_tp(tp: int, tokens: int) -> int:
    """Llama-3.1-70B's forward peak per GPU at TP `tp`, by hand: residual stream 2 x 8192,
    plus the wider of attention ((64 + 2 x 8) / tp x 128 + 64 / tp x 128 + 8192) and the
    MLP (8192 + 3 x 28672 / tp), 2 bytes each."""
    attn = (64 // tp + 2 * max(8 // tp, 1)) * 128 + 64 // tp * 128 + 8192
    mlp = 8192 + 3 * 28672 // tp
    return 2 * tokens * (2 * 8192 + max(attn, mlp))


@pytest.fixture(scope="module")
def llama70():
    return load_model("llama-3.1-70b")


def test_llama70_weights_by_hand(llama70):
    assert llama70.total_weight_bytes() == LLAMA70_BYTES
    assert llama70.kv_bytes_per_token_per_layer(1) * 80 == KV_PER_TOKEN


# ---- the 70B case: the old rule admitted requests the engines cannot hold -----------------


def test_vllm_sizes_llama70b_bf16_on_one_h200_small():
    # --gpu-memory-utilization 0.97: memory x 0.97 - weights = 5,127,400,325 B (4.78 GiB),
    # which the old rule made 15,647 tokens of KV. vLLM 0.24 (the H200's catalogue profile)
    # holds back the profile run's peak (the sampler's phase, 2,006,450,176 B, above the
    # forward's 1,811,939,328), 0.07 GiB of non-torch memory and the CUDA graphs, 102 x 23 MiB
    # + the 512-token forward = 2,573,205,504 B: 4.33 GiB, leaving 472,582,717 B = 1,442
    # tokens, 1,440 in whole 16-token blocks
    left = 0.97 * H200 - LLAMA70_BYTES
    assert int(left // KV_PER_TOKEN) == 15_647
    assert KERNEL == 2_006_450_176 and forward_tp(1, N) == 1_811_939_328
    graphs = GRAPH_COUNT * 23 * MiB + forward_tp(1, 512)
    assert graphs == 2_573_205_504
    kv = left - KERNEL - NON_TORCH - graphs
    assert int(kv // KV_PER_TOKEN) == 1_442
    sc = pipesim.build_scenario(
        box="h200-1x", engine="vllm", model="llama-3.1-70b", concurrency=1, gpu_memory_utilization=0.97
    )
    assert sc.profile.engine_version == "0.24.0"
    assert sc.memory.kv_tokens == 1_442 and sc.settings.kv_tokens == 1_440


def test_vllm_refuses_llama70b_bf16_on_one_h200_at_0_96():
    # 0.96 x memory - weights = 3,619,852,124 B, below the 4,654,817,608 B vLLM holds back
    assert 0.96 * H200 - LLAMA70_BYTES < KERNEL + NON_TORCH + GRAPH_COUNT * 23 * MiB + forward_tp(1, 512)
    with pytest.raises(UserError, match="llama-3.1-70b leaves no KV cache at tp=1 pp=1") as exc:
        pipesim.build_scenario(
            box="h200-1x", engine="vllm", model="llama-3.1-70b", concurrency=1, gpu_memory_utilization=0.96
        )
    assert "vLLM would refuse to start" in str(exc.value) and "activation peak 1.87" in str(exc.value)


def test_sglang_sizes_llama70b_bf16_on_one_h200_small():
    # --mem-fraction-static 0.97 of the memory free after the 1.15 GiB context (one GPU: no
    # communicators): 0.97 x (150,754,820,096 - 1,234,803,097.6) - weights = 3,929,641,320 B
    # = 11,992 tokens, where the old rule gave 15,647
    sc = pipesim.build_scenario(
        box="h200-1x", engine="sglang", model="llama-3.1-70b", concurrency=1, mem_fraction_static=0.97
    )
    kv = 0.97 * (H200 - CONTEXT) - LLAMA70_BYTES
    assert int(kv // KV_PER_TOKEN) == 11_992
    assert sc.memory.kv_tokens == 11_992
    assert sc.settings.kv_tokens == 11_992


def test_vllm_sizes_70b_fp8_on_one_80gb_h100_small():
    # a 70B that fits one 80 GB GPU at all: Llama-3.1-70B in block fp8 (quant_method fp8,
    # 128 x 128 blocks: 8 bits + one fp32 scale per block; embedding and lm_head bf16):
    # 67.7 GiB of weights under 0.9 x 80 = 72 GiB. The old rule left 4,638,965,760 B (14,157
    # tokens). Eager (no graphs), vLLM 0.24 holds back the sampler's phase and 0.07 GiB:
    # 2,557,353,656 B are left, 7,804 tokens; with its CUDA graphs (2.40 GiB) nothing is
    cfg = json.loads(resources.files("pipesim.data").joinpath("models", "llama-3.1-70b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    fp8 = from_hf_config(cfg, name="llama-3.1-70b-fp8")
    weights = 80 * LAYER * (1 + 4 / (128 * 128)) + 2 * 128256 * 8192 * 2
    assert fp8.total_weight_bytes() == pytest.approx(weights)
    assert int((0.9 * H100 - weights) // KV_PER_TOKEN) == 14_157
    kv = 0.9 * H100 - weights - KERNEL - NON_TORCH
    assert int(kv // KV_PER_TOKEN) == 7_804
    eager = pipesim.build_scenario(
        box="h100-sxm-4x", engine="vllm", model=fp8, tp=1, concurrency=1, enforce_eager=True
    )
    assert eager.memory.kv_tokens == 7_804
    with pytest.raises(UserError, match="llama-3.1-70b-fp8 leaves no KV cache at tp=1 pp=1"):
        pipesim.build_scenario(box="h100-sxm-4x", engine="vllm", model=fp8, tp=1, concurrency=1)


# ---- each engine's reservation for one model, by hand ---------------------------------------


def test_sglang_reservation_llama70b_tp4_h100():
    # _handle_gpu_memory_settings at 80 GiB, TP4: 512 + 1.5 x 8192 + 2 x 512 + 4/8 x 1024 =
    # 14,336 MB reserved: fraction round((81920 - 14336) / 81920, 3) = 0.825. Held: 0.825 x
    # (context 1.15 + NVLink communicators 2.01 GiB) = 2.607 GiB; weights per GPU 1/4
    sc = pipesim.build_scenario(
        box="h100-sxm-4x", engine="sglang", model="llama-3.1-70b", tp=4, concurrency=1
    )
    r = sc.memory.rule
    assert r.fraction == 0.825
    (held,) = r.held[0]
    assert held == ("context and communicators x fraction", pytest.approx(0.825 * (CONTEXT + NVLINK_COMM)))
    kv = 0.825 * H100 - LLAMA70_BYTES / 4 - 0.825 * (CONTEXT + NVLINK_COMM)
    assert sc.memory.kv_bytes[0] == pytest.approx(kv)
    assert sc.memory.kv_tokens == int(kv // (KV_PER_TOKEN / 4))


@pytest.mark.parametrize(
    "version, sampler, graphs, comm",
    [
        ("0.10.2", SORT, False, True),  # the sort; NCCL grew during profiling, inside the budget
        ("0.11.0", KERNEL, False, False),  # FlashInfer's sampler, installed and on by default
        ("0.14.0", SORT, False, False),  # PyTorch sort (PR #26859 until the kernels)
        ("0.19.0", KERNEL, False, False),
        ("0.24.0", KERNEL, True, False),  # the CUDA-graph estimate by default from 0.21
        ("", KERNEL, True, False),  # not stated: the newest rules
    ],
)
def test_vllm_reservation_llama70b_tp4_h100(llama70, version, sampler, graphs, comm):
    # TP4: the forward's MLP block 8192 + 3 x 7168 = 29,696 per token, residual 16,384:
    # 2 x 8192 x 46,080 = 754,974,720 B; the sampler's phase (full vocabulary on every rank,
    # gathered) binds either way. Graphs: 102 x 23 MiB + the forward at 512 tokens. Before
    # 0.11 the NVLink communicators (2.01 GiB) are held inside the budget
    box = load_box("h100-sxm-4x")
    plan = make_plan(4, 1, 80, 4, "vllm")
    rule = VLLMConfig().memory_rule(box, plan, llama70, version)
    assert forward_tp(4, N) == 754_974_720
    parts = dict(rule.held[0])
    assert parts["activation peak"] == sampler
    assert parts["non-torch memory"] == pytest.approx(NON_TORCH)
    assert parts.get("CUDA graphs") == (GRAPH_COUNT * 23 * MiB + forward_tp(4, 512) if graphs else None)
    assert parts.get("communicators") == (pytest.approx(NVLINK_COMM) if comm else None)
    assert rule.budget_bytes == 0.9 * H100 and not rule.refusal


def test_vllm_eager_holds_no_graphs(llama70):
    box, plan = load_box("h100-sxm-4x"), make_plan(4, 1, 80, 4, "vllm")
    rule = VLLMConfig(enforce_eager=True).memory_rule(box, plan, llama70, "0.24.0")
    assert "CUDA graphs" not in dict(rule.held[0])


def test_vllm_sampler_only_on_the_last_pp_stage(llama70):
    # PP2: stage 0 runs the forward alone; stage 1 the forward and then the sampler
    box, plan = load_box("h100-sxm-4x"), make_plan(2, 2, 80, 4, "vllm")
    rule = VLLMConfig().memory_rule(box, plan, llama70, "0.19.0")
    assert dict(rule.held[0])["activation peak"] == forward_tp(2, N)
    assert dict(rule.held[1])["activation peak"] == KERNEL


def test_small_gpu_defaults_shrink_the_profile_run(llama70):
    # below 70 GiB vLLM defaults to 256 sequences and 2048 tokens: the sampler's phase is
    # 2 x (2048 + 512) x 8192 + 256 x 128256 x 14 bytes at 0.19
    box, plan = load_box("l40s-8x"), make_plan(8, 1, 80, 8, "vllm")
    rule = VLLMConfig().memory_rule(box, plan, llama70, "0.19.0")
    assert dict(rule.held[0])["activation peak"] == 2 * (2048 + 512) * 8192 + 256 * 128256 * 14


def test_mixtral_moe_forward_by_hand():
    # Mixtral-8x7B at TP2, 8192 tokens: the MoE block holds its input (4096), the router's 8
    # logits and, per routed slot (top 2), gate_up 2 x 14336 / 2, the product 14336 / 2 and
    # the output 4096: 8192 x (4096 + 8) + 8192 x 2 x (21504 + 4096) elements, 2 bytes each,
    # wider than attention; plus the residual stream 2 x 4096
    m = load_model("mixtral-8x7b")
    plan = make_plan(2, 1, 32, 2, "vllm")
    moe = 2 * (8192 * (4096 + 8) + 8192 * 2 * (3 * 14336 // 2 + 4096))
    assert forward_peak_bytes(m, plan, 0, 8192) == 2 * 8192 * 2 * 4096 + moe


def test_kimi_mla_attention_block_by_hand():
    # Kimi K2.6 at TP8 (8 heads a GPU), attention: query 1536 + 8 x 192, latent 512 + 64,
    # kv_b's keys and values 8 x (128 + 128), full keys 8 x 192, output 8 x 128, o_proj 7168
    from pipesim.inputs.activations import attention_width

    m = load_model("kimi-k2.6")
    assert attention_width(m, 8) == 1536 + 8 * 192 + 576 + 8 * 256 + 8 * 192 + 8 * 128 + 7168


# ---- never negative; the engines' own refusals ----------------------------------------------


def test_vllm_startup_refusal_on_a_full_gpu(capsys):
    # --gpu-memory-utilization 0.99 of an L4's 24 GiB asks 23.76 GiB, but the context
    # (1.15 GiB) and PCIe communicators (0.39 GiB) leave 22.46 GiB free: vLLM stops at start
    with pytest.raises(SystemExit) as exc:
        main(
            ["predict", "--engine", "vllm", "--box", "l4-8x", "--model", "llama-3.1-8b", "--tp", "2",
             "--conc", "1", "--gpu-memory-utilization", "0.99"]
        )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    assert "vLLM would refuse to start" in err and "22.5 GiB of the 24.0 GiB" in err


def test_sglang_max_total_tokens_caps_the_pool():
    # init_memory_pool: min(profiled, --max-total-tokens); a larger cap keeps the profiled pool
    free = pipesim.build_scenario(box="h200-1x", model="llama-3.1-8b", engine="sglang", concurrency=1)
    capped = pipesim.build_scenario(
        box="h200-1x", model="llama-3.1-8b", engine="sglang", concurrency=1, max_total_tokens=20_000
    )
    above = pipesim.build_scenario(
        box="h200-1x", model="llama-3.1-8b", engine="sglang", concurrency=1, max_total_tokens=10**8
    )
    assert capped.memory.kv_tokens == capped.settings.kv_tokens == 20_000
    assert above.memory.kv_tokens == free.memory.kv_tokens > 20_000
    assert capped.describe()["kv_reservation"]["max_total_tokens"] == 20_000


def test_reservation_in_the_description_and_the_table(capsys):
    main(["predict", "--engine", "vllm", "--box", "h100-sxm-4x", "--model", "llama-3.1-70b", "--tp", "4",
          "--conc", "1", "--input-len", "16", "--output-len", "4", "--no-intervals", "--json"])  # fmt: skip
    kv = json.loads(capsys.readouterr().out)["scenario"]["kv_reservation"]
    assert kv["engine"] == "vLLM" and kv["fraction"] == 0.9 and kv["gpu_memory_gib"] == 80.0
    assert set(kv["held_gib"]) == {"activation peak", "non-torch memory", "CUDA graphs"}
    assert kv["held_gib"]["activation peak"] == round(KERNEL / GiB, 3)
    main(["predict", "--engine", "vllm", "--box", "h100-sxm-4x", "--model", "llama-3.1-70b", "--tp", "4",
          "--conc", "1", "--input-len", "16", "--output-len", "4", "--no-intervals"])  # fmt: skip
    line = capsys.readouterr().out.splitlines()[3]
    assert line.startswith(
        "  memory per GPU (stage 0): 80.0 GiB x 0.9 = 72.0 - weights 32.9 - activation peak 1.87"
    )


def test_sglang_config_rule_is_its_fraction_of_the_free_memory(llama70):
    # one GPU, no communicators: fraction x (memory - context) - weights; none held per stage but that
    box, plan = load_box("h200-1x"), make_plan(1, 1, 80, 1, "sglang")
    rule = SGLangConfig(mem_fraction_static=0.9).memory_rule(box, plan, llama70, "0.5.14")
    assert rule.budget_bytes == 0.9 * H200
    assert rule.held == ((("context and communicators x fraction", 0.9 * CONTEXT),),)

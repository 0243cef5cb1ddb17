"""The parallel plan: tensor, pipeline, data and expert parallelism, and the layer split.

Vocabulary (docs/parallel.md says where each rule is in the engines' source):

- `tp`, `pp`, `dp` are the engine's own flags (`--tp`, `--pp`, `--dp`).
- `attn_tp` is how many GPUs one attention layer (and the embedding and lm_head) spans.
  It is `tp`, except with SGLang's `--enable-dp-attention`, where the `dp` ranks split
  each stage's `tp` GPUs: `attn_tp = tp / dp`.
- The MoE layers of a stage span `moe_width = moe_tp x ep` GPUs: `ep` ranks each hold
  `num_experts / ep` experts, each expert split `moe_tp` ways. With data-parallel
  attention (SGLang) or vLLM's data parallel on an MoE model the MoE layers span every
  DP rank of the stage (`moe_spans_dp`): the DP ranks run them in lock step. Otherwise
  the DP ranks are independent replicas and the MoE spans one replica's `tp` GPUs.
- GPUs = `attn_tp x dp x pp`: SGLang `tp x pp` with DP attention, `tp x pp x dp` else;
  vLLM `tp x pp x dp`.

GPUs are numbered as the engines number ranks. With DP attention (SGLang) stage s holds
GPUs s*tp .. s*tp+tp-1 and DP rank d the `attn_tp` of them from s*tp + d*attn_tp; else DP
rank d holds the `tp x pp` GPUs from d*tp*pp, its stage s the `tp` from d*tp*pp + s*tp.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import require

ENGINE_RULES = ("sglang", "vllm")


@dataclass(frozen=True)
class Plan:
    tp: int
    pp: int
    layers_per_stage: tuple[int, ...]
    dp: int = 1  # data-parallel ranks: each with its own scheduler and attention
    ep: int = 1  # expert-parallel size of the MoE layers
    dp_attention: bool = False  # the DP ranks split each stage's tp GPUs (SGLang --enable-dp-attention)
    moe_spans_dp: bool = False  # the MoE layers span every DP rank of a stage, in lock step
    moe_a2a: str = "none"  # expert parallel's token traffic: "none" (engines' default) | "alltoall" (moe.py)

    @property
    def attn_tp(self) -> int:
        """GPUs one attention layer spans (its all-reduce group)."""
        return self.tp // self.dp if self.dp_attention else self.tp

    @property
    def moe_width(self) -> int:
        """GPUs one MoE layer spans: moe_tp x ep."""
        return self.attn_tp * self.dp if self.moe_spans_dp else self.attn_tp

    @property
    def moe_tp(self) -> int:
        """Ways each expert is split (tensor parallel inside the MoE)."""
        return self.moe_width // self.ep

    @property
    def stage_width(self) -> int:
        """GPUs of one stage over all DP ranks."""
        return self.attn_tp * self.dp

    @property
    def gpus(self) -> int:
        return self.stage_width * self.pp

    def experts_per_rank(self, num_experts: int) -> int:
        """Routed experts the fullest EP rank holds: num_experts / ep, the remainder one
        each on the first ranks (vLLM determine_expert_map, docs/parallel.md §2)."""
        return -(-num_experts // self.ep)

    def gpu(self, stage: int, dp_rank: int = 0, tp_rank: int = 0) -> int:
        if self.dp_attention:
            return stage * self.tp + dp_rank * self.attn_tp + tp_rank
        return dp_rank * self.tp * self.pp + stage * self.tp + tp_rank

    def stage_gpus(self, stage: int, dp_rank: int = 0) -> tuple[int, ...]:
        """The attention (TP) group of `stage` in DP rank `dp_rank`."""
        return tuple(self.gpu(stage, dp_rank, r) for r in range(self.attn_tp))

    def moe_gpus(self, stage: int, dp_rank: int = 0) -> tuple[int, ...]:
        """The GPUs one MoE layer of `stage` spans (DP rank `dp_rank`'s replica when the
        ranks are independent)."""
        ranks = range(self.dp) if self.moe_spans_dp else (dp_rank,)
        return tuple(g for d in ranks for g in self.stage_gpus(stage, d))

    def stage_layers(self, stage: int) -> range:
        start = sum(self.layers_per_stage[:stage])
        return range(start, start + self.layers_per_stage[stage])

    def label(self) -> str:
        """TP8, TP2xPP4, DP8-attn x TP8 x EP8, ... as reports print it."""
        parts = [f"TP{self.tp}"] + ([f"PP{self.pp}"] if self.pp > 1 else [])
        if self.dp > 1:
            parts.append(f"DP{self.dp}" + ("-attn" if self.dp_attention else ""))
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        return "x".join(parts)


def partition(num_layers: int, pp: int, rule: str) -> tuple[int, ...]:
    """Layers per stage by an engine's rule.

    - "sglang": equal split, the last `num_layers % pp` stages get one more layer
      (Kimi's 61 layers on PP8: 7,7,7,8,8,8,8,8);
    - "vllm": equal split, the remainder given one layer each to the stages before the
      last, counting back from the second-to-last (vllm/distributed/utils.py
      get_pp_indices: `partitions[-i] += 1 for i in range(2, remainder + 2)`).
    """
    base, extra = divmod(num_layers, pp)
    if rule == "sglang":
        return tuple(base + (1 if s >= pp - extra else 0) for s in range(pp))
    if rule == "vllm":
        parts = [base] * pp
        for i in range(2, extra + 2):
            parts[-i] += 1
        return tuple(parts)
    raise ValueError(f"unknown partition rule {rule}")


def resolve_ep(
    engine: str, tp: int, dp: int, ep: int, enable_expert_parallel: bool, dp_attention: bool, num_experts: int
) -> int:
    """The expert-parallel size the engine runs with (docs/parallel.md §2).

    vLLM `--enable-expert-parallel`: EP over every GPU an MoE layer spans, dp x tp
    (vllm/config/parallel.py: MoE layers are sharded over the product of the tensor and
    data parallel sizes; EP replaces TP inside them), so `--ep` may only say 1 or dp x tp.
    SGLang `--ep-size` (`--expert-parallel-size`): any divisor of tp; the experts are
    then split tp / ep ways (moe_tp_size). `--enable-expert-parallel` with SGLang means
    ep = tp (its former `--enable-ep-moe`).
    """
    require(isinstance(ep, int) and ep >= 1, f"ep must be a whole number >= 1, got {ep}")
    if (ep > 1 or enable_expert_parallel) and not num_experts:
        require(False, "expert parallel (--ep / --enable-expert-parallel) needs a mixture-of-experts model")
    if engine == "vllm":
        width = tp * dp if num_experts else tp
        if enable_expert_parallel:
            require(
                ep in (1, width),
                f"--ep {ep} with --enable-expert-parallel: vLLM's EP size is dp x tp = {width}; allowed: {width}",
            )
            return width
        require(
            ep in (1, width),
            f"--ep {ep}: vLLM's expert parallel spans dp x tp = {dp} x {tp} = {width} GPUs; allowed: 1 or {width}",
        )
        return ep
    if enable_expert_parallel:
        require(
            ep in (1, tp), f"--ep {ep} with --enable-expert-parallel (SGLang: ep = tp = {tp}); allowed: {tp}"
        )
        ep = tp
    require(
        ep <= tp and tp % ep == 0,
        f"--ep-size {ep}: SGLang splits each stage's tp = {tp} GPUs into ep groups (moe_tp_size = tp / ep); "
        f"allowed: a divisor of {tp}",
    )
    return ep


def make_plan(
    tp: int,
    pp: int,
    num_layers: int,
    gpu_count: int,
    rule: str,
    layers: tuple[int, ...] | None = None,
    *,
    dp: int = 1,
    ep: int = 1,
    dp_attention: bool = False,
    enable_expert_parallel: bool = False,
    num_experts: int = 0,
    moe_a2a: str = "none",
) -> Plan:
    """A validated plan. `rule` is the engine ("sglang" | "vllm"): its layer split and
    its GPU-count and EP rules; `num_experts` the model's routed experts (0: dense)."""
    require(isinstance(tp, int) and tp >= 1, f"tp must be a whole number >= 1, got {tp}")
    require(isinstance(pp, int) and pp >= 1, f"pp must be a whole number >= 1, got {pp}")
    require(isinstance(dp, int) and dp >= 1, f"dp must be a whole number >= 1, got {dp}")
    require(
        not dp_attention or rule == "sglang",
        "--enable-dp-attention is an SGLang flag; vLLM's --data-parallel-size runs attention data-parallel "
        "on an MoE model by itself",
    )
    if dp_attention:
        require(
            tp % dp == 0,
            f"--enable-dp-attention: dp={dp} must divide tp={tp} (SGLang splits each stage's tp GPUs into "
            f"dp attention groups); allowed dp: {', '.join(str(d) for d in range(1, tp + 1) if tp % d == 0)}",
        )
    dp_attention = dp_attention and dp > 1  # SGLang turns it off at dp 1 (_handle_data_parallelism)
    ep = resolve_ep(rule, tp, dp, ep, enable_expert_parallel, dp_attention, num_experts)
    gpus = tp * pp if dp_attention else tp * pp * dp
    formula = "tp x pp" if dp_attention else "tp x pp x dp"
    if dp == 1:
        require(
            gpus <= gpu_count,
            f"tp x pp = {tp} x {pp} = {gpus} GPUs, but the box has {gpu_count}; allowed: tp x pp <= {gpu_count}",
        )
    else:
        require(
            gpus <= gpu_count,
            f"{formula} = {gpus} GPUs (tp={tp} pp={pp} dp={dp}), but the box has {gpu_count}; "
            f"allowed: {formula} <= {gpu_count}",
        )
    require(
        pp <= num_layers,
        f"pp={pp} is more stages than the model's {num_layers} layers; allowed: pp <= {num_layers}",
    )
    if num_experts:
        require(
            ep <= num_experts,
            f"ep={ep} is more expert-parallel ranks than the model's {num_experts} experts; allowed: ep <= {num_experts}",
        )
    if layers is None:
        layers = partition(num_layers, pp, rule)
    else:
        require(len(layers) == pp, f"--layers gives {len(layers)} stages but pp={pp}")
        require(
            all(n >= 1 for n in layers),
            f"--layers {','.join(map(str, layers))}: every stage needs at least one layer",
        )
        require(
            sum(layers) == num_layers,
            f"--layers {','.join(map(str, layers))} sums to {sum(layers)}, the model has {num_layers} layers",
        )
    # vLLM: an MoE model's DP ranks share the MoE layers (docs/parallel.md §1); SGLang: with DP attention
    moe_spans_dp = dp > 1 and (dp_attention if rule == "sglang" else bool(num_experts))
    moe_a2a = resolve_a2a(moe_a2a)
    require(
        moe_a2a == "none" or ep > 1,
        f"--moe-a2a-backend {moe_a2a} dispatches tokens to expert-parallel ranks; give --ep > 1 with it",
    )
    return Plan(tp, pp, tuple(layers), dp, ep, dp_attention, moe_spans_dp, moe_a2a)


# the engines' names of an all-to-all backend -> pipesim's mode (moe.py, docs/parallel.md §4)
A2A_NAMES = {
    "none": "none",  # SGLang --moe-a2a-backend default
    "allgather_reducescatter": "none",  # vLLM --all2all-backend default
    "alltoall": "alltoall",
    "deepep": "alltoall",
    "deepep_high_throughput": "alltoall",
    "deepep_low_latency": "alltoall",
    "pplx": "alltoall",
    "naive": "alltoall",
}


def resolve_a2a(name: str) -> str:
    require(
        isinstance(name, str) and name in A2A_NAMES,
        f"--moe-a2a-backend {name!r} is not known; allowed: {', '.join(A2A_NAMES)}",
    )
    return A2A_NAMES[name]

"""Model architecture: what a decoder-only transformer is made of, from an HF config.

Two attention families, each with dense or mixture-of-experts MLPs:
- GQA models (Llama, Mistral, Qwen, Phi-3/4, Gemma 2): attention with
  `num_key_value_heads`, a gated MLP; with routed experts (Mixtral, OLMoE, Qwen2/3-MoE,
  GLM-4.5/4.6 with a shared expert and the first `first_k_dense_replace` layers dense,
  gpt-oss with every layer MoE);
- MLA + MoE models (DeepSeek-V2/V3, Kimi K2.x): Multi-head Latent Attention, routed and
  shared experts, the first `first_k_dense_replace` layers dense.
Which architectures, and how each config names its sizes: architectures.py.
Not priced: attention biases and sinks (a few parameters per head), norms, sliding windows
(gpt-oss's 128 tokens on every other layer, Gemma 2's 4096 on every other layer: those
layers are priced and cached as full attention, an upper bound on their attention time
and KV memory), multi-token-prediction layers.

Sizes are counted from the config (parameters x bytes per parameter), never looked up.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.checks import MAX_CONFIG_SIZE, MAX_JSON_DEPTH, MAX_LAYERS, is_number, read_text, too_deep
from ..base.errors import UserError, require
from .architectures import ARCHITECTURES, MODEL_TYPES, check_moe_layers, shared_experts, tied_embeddings
from .model_presets import looks_like_hf_id, preset_for, preset_names, preset_text
from .quantization import BF16, BYTES_PER_PARAM, KV_BYTES_PER_ELEMENT, WeightFormat, as_format, weight_formats

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["BYTES_PER_PARAM", "Model", "WeightFormat", "from_hf_config", "load_model"]


@dataclass(frozen=True)
class MLA:
    """Multi-head Latent Attention dimensions (DeepSeek-V2/V3 family)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts dimensions."""

    n_routed_experts: int
    topk: int
    moe_intermediate: int
    n_shared_experts: int
    first_k_dense: int
    layer_freq: int = 1


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer, as far as its cost and memory go."""

    name: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_context: int
    mla: MLA | None = None
    moe: MoE | None = None
    attn_dtype: WeightFormat = BF16  # attention projections, dense MLP, shared experts
    expert_dtype: WeightFormat = BF16  # routed experts
    embed_dtype: WeightFormat = BF16  # embedding and lm_head
    kv_cache_dtype: str = "bf16"  # bf16 | fp8 (quantization.kv_cache_dtype reads the engines' names)
    tied_embeddings: bool = False  # the lm_head is the embedding (tie_word_embeddings)

    # ---- structure -------------------------------------------------------------
    def is_moe_layer(self, layer: int) -> bool:
        m = self.moe
        return m is not None and layer >= m.first_k_dense and (layer - m.first_k_dense) % m.layer_freq == 0

    @property
    def family(self) -> str:
        return "mla" if self.mla else "gqa"

    # ---- parameters (counted from the config) ------------------------------------
    def attention_params(self) -> int:
        h = self.hidden
        if self.mla:
            a = self.mla
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            q = h * a.q_lora_rank + a.q_lora_rank * self.heads * qk if a.q_lora_rank else h * self.heads * qk
            kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * self.heads * (
                a.qk_nope_head_dim + a.v_head_dim
            )
            o = self.heads * a.v_head_dim * h
            return q + kv + o
        return h * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * h

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    def expert_params(self) -> int:
        """One routed expert (gate, up, down)."""
        assert self.moe
        return 3 * self.hidden * self.moe.moe_intermediate

    def layer_weight_bytes(self, layer: int, dtype: str | WeightFormat | None = None) -> float:
        """Bytes of one decoder layer's weights (whole layer, before any TP split), in
        the model's own weight formats, or with every projection and expert in `dtype`
        (e.g. "bf16": a random-weight copy built from the config). The router stays bf16."""
        over = as_format(dtype)
        attn_bytes = (over or self.attn_dtype).bytes_per_param
        attn = self.attention_params() * attn_bytes
        if self.is_moe_layer(layer):
            m = self.moe
            assert m is not None  # is_moe_layer: a MoE model
            routed = m.n_routed_experts * self.expert_params() * (over or self.expert_dtype).bytes_per_param
            shared = m.n_shared_experts * self.expert_params() * attn_bytes
            router = self.hidden * m.n_routed_experts * 2
            return attn + routed + shared + router
        return attn + self.dense_mlp_params() * attn_bytes

    def routed_expert_bytes(self, layer: int) -> float:
        """Bytes of one layer's routed experts (all of them; 0 for a dense layer): the
        part expert parallel divides by ep instead of by TP."""
        if not self.is_moe_layer(layer):
            return 0.0
        assert self.moe is not None  # is_moe_layer: a MoE model
        return self.moe.n_routed_experts * self.expert_params() * self.expert_dtype.bytes_per_param

    def embedding_bytes(self, dtype: str | WeightFormat | None = None) -> float:
        """Bytes of the embedding (or of the lm_head), in the model's format or `dtype`."""
        return self.vocab * self.hidden * (as_format(dtype) or self.embed_dtype).bytes_per_param

    def total_weight_bytes(self, dtype: str | WeightFormat | None = None) -> float:
        """Every layer, the embedding and the lm_head (once when tied), as `layer_weight_bytes`."""
        embeddings = 1 if self.tied_embeddings else 2
        return sum(
            self.layer_weight_bytes(i, dtype) for i in range(self.num_layers)
        ) + embeddings * self.embedding_bytes(dtype)

    def params(self, active: bool = False) -> int:
        """Parameters, as model cards count them: every layer (attention, router, experts or
        MLP) plus the embedding and the lm_head (once when tied). `active`: those one token
        uses, the routed experts counted `topk` times instead of all (the cards' "active")."""
        total = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        for i in range(self.num_layers):
            total += self.attention_params()
            if not self.is_moe_layer(i):
                total += self.dense_mlp_params()
                continue
            m = self.moe
            assert m is not None  # an MoE layer is one of a model with an MoE section
            routed = m.topk if active else m.n_routed_experts
            total += (routed + m.n_shared_experts) * self.expert_params() + self.hidden * m.n_routed_experts
        return total

    # ---- KV cache -----------------------------------------------------------------
    @property
    def kv_bytes_per_element(self) -> float:
        return KV_BYTES_PER_ELEMENT[self.kv_cache_dtype]

    def kv_bytes_per_token_per_layer(self, tp: int) -> float:
        """KV-cache bytes one GPU holds per token per layer at tensor parallelism `tp`.

        MLA caches one latent (kv_lora_rank + rope dims) per token, replicated on every
        TP rank; GQA caches K and V of `kv_heads` heads, split over TP ranks (a head is
        replicated when there are fewer KV heads than ranks).
        """
        elem = self.kv_bytes_per_element
        if self.mla:
            return (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * elem
        heads_per_gpu = max(self.kv_heads // tp, 1)
        return 2 * heads_per_gpu * self.head_dim * elem

    # ---- sharding rules -------------------------------------------------------------
    def _check_dense_tp(self, tp: int, what: str, allowed: str) -> None:
        """Raise UserError when the attention heads, the KV heads or the dense MLP cannot be
        split `tp` ways; `what` names tp in the message ('tp', 'attention tp'), `allowed`
        introduces the divisors of the heads."""
        require(
            self.heads % tp == 0,
            f"{what}={tp} does not divide {self.name}'s {self.heads} attention heads; {allowed}: "
            f"{', '.join(str(t) for t in _divisors(self.heads))}",
        )
        if not self.mla:
            require(
                self.kv_heads % tp == 0 or tp % self.kv_heads == 0,
                f"{what}={tp} cannot split {self.name}'s {self.kv_heads} KV heads (need tp | kv_heads or kv_heads | tp)",
            )
        require(
            self.intermediate % tp == 0,
            f"{what}={tp} does not divide {self.name}'s MLP intermediate size {self.intermediate}",
        )

    def check_tp(self, tp: int) -> None:
        """Raise UserError when this model cannot be split `tp` ways by tensor parallelism."""
        self._check_dense_tp(tp, "tp", "allowed tp")
        if self.moe:
            require(
                self.moe.moe_intermediate % tp == 0,
                f"tp={tp} does not divide {self.name}'s expert intermediate size {self.moe.moe_intermediate}",
            )

    def check_plan(self, plan: Plan) -> None:
        """Raise UserError when `plan` cannot split this model: attention over `attn_tp`
        GPUs, each routed expert over `moe_tp` (docs/parallel.md)."""
        if plan.dp == 1 and plan.ep == 1:
            self.check_tp(plan.tp)
            return
        self._check_dense_tp(plan.attn_tp, "attention tp", "allowed")
        if self.moe:
            require(
                self.moe.moe_intermediate % plan.moe_tp == 0,
                f"moe_tp={plan.moe_tp} (MoE GPUs {plan.moe_width} / ep {plan.ep}) does not divide "
                f"{self.name}'s expert intermediate size {self.moe.moe_intermediate}",
            )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---- loading ------------------------------------------------------------------------


def load_model(name_or_path: str | Path) -> Model:
    """A preset name (see `preset_names()`) or the path of a Hugging Face config.json."""
    cfg, name = read_hf_config(name_or_path)
    return from_hf_config(cfg, name=name)


def _config_name(cfg: object, given: str) -> str:
    """What a model given as a config file is called: the repository it names (the
    `_name_or_path` transformers writes, or a preset's `_hf_id`), else the path as given
    (a folder's name alone, 'to' for path/to/config.json, says nothing)."""
    if isinstance(cfg, dict):
        for key in ("_name_or_path", "_hf_id"):
            value = cfg.get(key)
            if isinstance(value, str) and value.strip() and not Path(value).is_absolute():
                return value.strip()
    return given


def read_hf_config(name_or_path: str | Path) -> tuple[dict, str]:
    """The Hugging Face config dict behind a preset name, a Hugging Face id a preset
    stands for (model_presets.py), or a config.json path (or its folder), and the
    model's name; one UserError line when it cannot be read."""
    text = str(name_or_path)
    require(
        text.strip() != "",
        f"the model is empty; give a preset name ({', '.join(preset_names())}) or a config.json",
    )
    path = Path(text)
    preset = preset_for(text)
    if preset is not None and (preset == text or not path.exists()):  # a downloaded folder: its own config
        return json.loads(preset_text(preset)), preset
    if looks_like_hf_id(text) and not path.exists():
        raise UserError(
            f"unknown model '{text}': no preset stands for this Hugging Face id (pipesim downloads nothing); "
            f"save its config.json and give its path, or a preset: {', '.join(preset_names())}"
        )
    if path.suffix == ".json" or path.is_dir() or path.exists():
        if path.is_dir():
            path = path / "config.json"
        require(
            path.is_file(),
            f"model config not found: {path} (give a preset name: "
            f"{', '.join(preset_names())}, or the path of a Hugging Face config.json)",
        )
        try:
            text = read_text(path, "model config")
        except OSError as exc:
            raise UserError(f"cannot read model config {path}: {exc}") from None
        require(
            not too_deep(text),
            f"model config {path} is nested too deeply (more than {MAX_JSON_DEPTH} levels)",
        )
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"cannot read model config {path}: {exc}") from None
        except RecursionError:
            raise UserError(f"model config {path} is nested too deeply") from None
        return cfg, _config_name(cfg, str(name_or_path))
    raise UserError(
        f"unknown model '{text}'; known presets: {', '.join(preset_names())}, "
        "or the path of a Hugging Face config.json"
    )


def _text(cfg: dict, name: str) -> dict:
    """The language model's part of a config: `text_config` in multimodal ones."""
    inner = cfg.get("text_config", cfg)
    require(
        isinstance(inner, dict),
        f"model config {name}: 'text_config' must be a JSON object, got {type(inner).__name__}",
    )
    return inner


def _get(cfg: dict[str, Any], key: str, name: str, default: object = None) -> Any:
    """A field of the config (a JSON value), else `default`; a number is finite and >= 0."""
    cfg = _text(cfg, name)
    if key in cfg and cfg[key] is not None:
        value = cfg[key]
    elif default is not None:
        value = default
    else:
        raise UserError(f"model config {name} lacks '{key}', which pipesim needs")
    if is_number(value):
        require(math.isfinite(value), f"model config {name}: '{key}' = {value} must be a finite whole number")
        require(value >= 0, f"model config {name}: '{key}' = {value} must not be negative")
    return value


def _int(cfg: dict[str, Any], key: str, name: str, default: object = None, lo: int = 0) -> int:
    """A whole-number field of the config in [lo, its limit], or a UserError naming it."""
    value = _get(cfg, key, name, default)
    if not is_number(value) or value != int(value) or value < lo:
        raise UserError(f"model config {name}: '{key}' = {value!r} must be a whole number >= {lo}")
    limit = MAX_LAYERS if key == "num_hidden_layers" else MAX_CONFIG_SIZE
    require(value <= limit, f"model config {name}: '{key}' = {value!r} is above the limit of {limit}")
    return int(value)


# torch_dtype of unquantized weights: all served in 16 bits (see `_weight_dtypes`)
TORCH_DTYPES = ("bfloat16", "float16", "float32", "auto")


def _check_kind(cfg: dict, name: str) -> None:
    """Refuse an architecture or weight dtype that is not modelled (a config without the
    keys, e.g. a hand-written one, is taken as the dense family)."""
    archs = cfg.get("architectures")
    if archs is not None:
        require(
            isinstance(archs, list) and all(isinstance(a, str) for a in archs),
            f"model config {name}: 'architectures' must be a list of names, got {archs!r}",
        )
        for a in archs:
            require(
                a in ARCHITECTURES,
                f"model config {name}: architecture {a} is not modelled; "
                f"modelled: {', '.join(ARCHITECTURES)}",
            )
    elif cfg.get("model_type") is not None:
        mt = cfg["model_type"]
        require(
            mt in MODEL_TYPES,
            f"model config {name}: model_type {mt!r} is not modelled; modelled: {', '.join(MODEL_TYPES)}",
        )
    for key in ("torch_dtype", "dtype"):
        dt = cfg.get(key)
        require(
            dt is None or dt in TORCH_DTYPES,
            f"model config {name}: {key} {dt!r} is not modelled; "
            f"allowed: {', '.join(TORCH_DTYPES)} (unquantized weights are served in 16 bits)",
        )


def from_hf_config(cfg: dict, name: str = "model") -> Model:
    """Build a `Model` from a Hugging Face-style config dict."""
    require(isinstance(cfg, dict), f"model config {name} is not a JSON object")
    text = _text(cfg, name)
    _check_kind(text, name)
    g = lambda k, d=None, lo=1: _int(cfg, k, name, d, lo)  # noqa: E731
    hidden, heads = g("hidden_size"), g("num_attention_heads")
    mla = None
    if _get(cfg, "kv_lora_rank", name, 0):
        mla = MLA(
            g("q_lora_rank", 0, 0),
            g("kv_lora_rank"),
            g("qk_nope_head_dim"),
            g("qk_rope_head_dim"),
            g("v_head_dim"),
        )
    moe = None
    n_experts = (
        _int(cfg, "n_routed_experts", name, 0)
        or _int(cfg, "num_experts", name, 0)
        or _int(cfg, "num_local_experts", name, 0)  # gpt-oss, Mixtral
    )
    if n_experts:
        moe = MoE(
            n_experts,
            g("num_experts_per_tok"),
            # gpt-oss and Mixtral name the expert's size intermediate_size (every layer is MoE)
            g("moe_intermediate_size", _get(cfg, "intermediate_size", name)),
            g("n_shared_experts", 0, 0),
            g("first_k_dense_replace", 0, 0),
            g("moe_layer_freq", 1, 0) or 1,
        )
        require(
            moe.topk <= n_experts,
            f"model config {name}: num_experts_per_tok = {moe.topk} is more than the "
            f"{n_experts} experts; allowed: 1 to {n_experts}",
        )
    if moe:
        check_moe_layers(text, name)
        fused = shared_experts(text, moe.moe_intermediate, name)
        if fused is not None:  # Qwen2-MoE's shared expert (architectures.py)
            moe = replace(moe, n_shared_experts=fused)
    quant = cfg.get("quantization_config") or text.get("quantization_config") or {}
    require(
        isinstance(quant, dict),
        f"model config {name}: 'quantization_config' must be a JSON object, got {type(quant).__name__}",
    )
    attn_dtype, expert_dtype = weight_formats(quant, name)
    kv_heads = g("num_key_value_heads", heads)
    require(
        kv_heads <= heads and heads % kv_heads == 0,
        f"model config {name}: num_key_value_heads = {kv_heads} must divide num_attention_heads = {heads}",
    )
    model = Model(
        name=name,
        num_layers=g("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=g("head_dim", max(hidden // heads, 1)),
        intermediate=g("intermediate_size"),
        vocab=g("vocab_size"),
        max_context=g("max_position_embeddings", 131072),
        mla=mla,
        moe=moe,
        attn_dtype=attn_dtype,
        expert_dtype=expert_dtype,
        tied_embeddings=tied_embeddings({**cfg, **text}),  # a multimodal config may tie at its top level
    )
    return model

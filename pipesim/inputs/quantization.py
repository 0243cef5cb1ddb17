"""Weight formats, read from a Hugging Face `quantization_config`.

Bytes per parameter are counted from the config: `bits` per weight, plus one scale
(and, for asymmetric formats, one zero point) per `group` weights:

    bytes/param = (bits + (scale_bits + zero_bits) / group) / 8

What each method stores, as the engines load it (vLLM v0.11
vllm/model_executor/layers/quantization/, SGLang python/sglang/srt/layers/quantization/):
- awq (`AWQConfig.from_config`, served by awq_marlin): int4 `qweight`, one fp16
  `scales` and one packed 4-bit `qzeros` per group of `group_size` (`zero_point`);
- gptq (`GPTQConfig.from_config`, served by gptq_marlin): `bits`-bit weights, fp16
  scales and packed `qzeros` per group (GPTQ checkpoints store qzeros even when
  symmetric); `group_size` -1 is one scale per output channel. `g_idx` (one int32 per
  input row) is left out: 32 / n_out bits per weight, under 0.01 bits here;
- compressed-tensors (`CompressedTensorsConfig`): `config_groups` of weights
  {num_bits, type int|float, strategy group|channel|tensor|block|tensor_group,
  group_size, symmetric}; input_activations present = W8A8 / W4A4 (the GEMM runs in
  the low precision), absent = weight-only (dequantized to bf16 math); scales are
  stored in the model's 16-bit dtype, fp4 groups in fp8 e4m3;
- fp8 (`Fp8Config`): fp8 e4m3 weights; `weight_block_size` [128, 128] = one fp32
  `weight_scale_inv` per block, else one scale per tensor;
- modelopt NVFP4 (`ModelOptNvFp4Config`): fp4 e2m1 weights with one fp8 e4m3 scale
  per 16 (plus one fp32 global scale per tensor, negligible); FP8: per-tensor fp8;
- mxfp4 (gpt-oss, `Mxfp4Config`; OCP Microscaling v1.0): fp4 e2m1 with one e8m0
  (8-bit) scale per 32 weights, bf16 activations.

Modules listed unquantized (`modules_to_not_convert`, `ignore`, `exclude_modules`)
stay 16-bit: attention when the list names it (self_attn / attn projections), the
routed experts when it names `experts`. The router, norms, embedding and lm_head are
always 16-bit here (the engines quantize lm_head only on an explicit flag).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

from ..base.checks import Fields
from ..base.errors import UserError, require


@dataclass(frozen=True)
class WeightFormat:
    """How weights are stored: `bits` per weight, one `scale_bits` scale (and one
    `zero_bits` zero point) per `group` weights (0: one per tensor or per output
    channel, negligible next to the weights).

    `kernel` names the kernel family (the profile's gemm/moe `dtype` key), `compute`
    the tensor-core math it runs (hardware.GPU.flops): weight-only formats dequantize
    to bf16 math."""

    name: str
    kernel: str
    bits: int
    group: int = 0
    scale_bits: int = 0
    zero_bits: int = 0
    compute: str = "bf16"

    @property
    def bytes_per_param(self) -> float:
        overhead = (self.scale_bits + self.zero_bits) / self.group if self.group else 0.0
        return (self.bits + overhead) / 8.0

    def __str__(self) -> str:
        return self.name


BF16 = WeightFormat("bf16", "bf16", 16)
# DeepSeek-V3 style block fp8: one fp32 scale per 128 x 128 block (8 + 32/16384 bits)
FP8_BLOCK = WeightFormat("fp8-block128x128", "fp8", 8, 128 * 128, 32, compute="fp8")
# Kimi K2.x: int4, one bf16 scale per group of 32, symmetric (4 + 16/32 = 4.5 bits)
INT4_G32 = WeightFormat("int4-g32", "int4", 4, 32, 16)
FORMATS = {"bf16": BF16, "fp8": FP8_BLOCK, "int4": INT4_G32}
# the kernel families a format's GEMM runs (WeightFormat.kernel): the `dtype` of the profile's tables
KERNELS = ("bf16", "fp8", "int4", "int8", "nvfp4", "mxfp4")
BYTES_PER_PARAM = {k: f.bytes_per_param for k, f in FORMATS.items()}

SUPPORTED = (
    "awq, gptq, compressed-tensors (int4/int8/fp8/nvfp4), fp8, modelopt (NVFP4/FP8), mxfp4, or none (bf16)"
)
# module names of attention projections (norms such as post_attention_layernorm are not)
_ATTENTION = re.compile(r"self_attn|(?:^|[.*:])attn(?:$|[.*])|\b[qkvo]_proj|qkv_proj|q_a_proj|kv_a_proj")
_EXPERTS = re.compile(r"(?<!shared_)experts")


@overload
def as_format(dtype: str | WeightFormat) -> WeightFormat: ...
@overload
def as_format(dtype: None) -> None: ...
def as_format(dtype: str | WeightFormat | None) -> WeightFormat | None:
    """A format, or the one a name in FORMATS stands for (None stays None)."""
    if dtype is None or isinstance(dtype, WeightFormat):
        return dtype
    require(dtype in FORMATS, f"unknown weight format '{dtype}'; known: {', '.join(FORMATS)}")
    return FORMATS[dtype]


def int_format(bits: int, group: int, zero_point: bool, method: str) -> WeightFormat:
    """An integer weight-only format with 16-bit scales (AWQ, GPTQ, compressed-tensors)."""
    group = 0 if group is None or group <= 0 else int(group)
    zero = bits if zero_point else 0
    tag = f"g{group}" if group else "channel"
    return WeightFormat(
        f"{method}-int{bits}-{tag}", f"int{bits}", bits, group, 16 if group else 0, zero if group else 0
    )


def nvfp4(compute: str = "fp4") -> WeightFormat:
    return WeightFormat("nvfp4", "nvfp4", 4, 16, 8, compute=compute)


MXFP4 = WeightFormat("mxfp4", "mxfp4", 4, 32, 8)


def weight_formats(quant: dict, name: str = "model") -> tuple[WeightFormat, WeightFormat]:
    """(format of attention / dense / shared-expert weights, format of routed experts).
    Every field is read through checks.Fields: a value of the wrong type or out of range
    is one line naming it."""
    q = Fields.of(quant, f"model config {name}: quantization_config")
    method = str(quant.get("quant_method", "")).lower()
    if not method:
        return BF16, BF16
    if method == "compressed-tensors":
        return _compressed_tensors(q, name)
    if method == "fp8":
        fmt = _fp8(q.wholes("weight_block_size", 2), 32)
        return _apply_ignore(fmt, fmt, q, "modules_to_not_convert", "ignored_layers")
    if method in ("awq", "awq_marlin"):
        bits = q.whole("bits", q.whole("w_bit", 4, 1, 64), 1, 64)
        require(bits == 4, f"model config {name}: AWQ with {bits} bits is not served by the engines (4 only)")
        group = q.whole("group_size", q.whole("q_group_size", 128))
        fmt = int_format(bits, group, q.flag("zero_point", True), "awq")
        return _apply_ignore(fmt, fmt, q, "modules_to_not_convert")
    if method in ("gptq", "gptq_marlin"):
        bits = q.whole("bits", 4, 1, 64)
        require(bits in (4, 8), f"model config {name}: GPTQ with {bits} bits is not modelled (4 or 8)")
        group = q.whole("group_size", 128, -1)
        require(group != 0, f"model config {name}: quantization_config 'group_size' = 0 must be -1 or >= 1")
        fmt = int_format(bits, group, True, "gptq")
        return _apply_ignore(fmt, fmt, q, "modules_to_not_convert")
    if method == "modelopt":
        inner = q.section("quantization") or q
        algo = inner.data.get("quant_algo", "")
        if not isinstance(algo, str) or algo.upper() not in ("NVFP4", "FP8"):
            raise UserError(
                f"model config {name}: modelopt quant_algo '{algo}' is not modelled (NVFP4 or FP8)"
            )
        fmt = nvfp4() if algo.upper() == "NVFP4" else _fp8(None, 32)
        if "exclude_modules" in inner.data:
            return _apply_ignore(fmt, fmt, inner, "exclude_modules")
        return _apply_ignore(fmt, fmt, q, "ignore")
    if method == "mxfp4":
        return _apply_ignore(MXFP4, MXFP4, q, "modules_to_not_convert")
    raise UserError(f"quantization '{method}' is not modelled; supported: {SUPPORTED}")


def _fp8(
    block: Sequence[int] | None, scale_bits: int, compute: str = "fp8", label: str = "tensor"
) -> WeightFormat:
    suffix = "" if compute == "fp8" else "-weight-only"
    if block:
        n, k = block
        return WeightFormat(f"fp8-block{n}x{k}{suffix}", "fp8", 8, n * k, scale_bits, compute=compute)
    return WeightFormat(f"fp8-{label}{suffix}", "fp8", 8, compute=compute)


def _apply_ignore(
    attn: WeightFormat, experts: WeightFormat, q: Fields, *keys: str
) -> tuple[WeightFormat, WeightFormat]:
    """16-bit for the module classes the config's unquantized list names (the first of
    `keys` it has)."""
    key = next((k for k in keys if q.data.get(k)), keys[0])
    ignore = q.data.get(key)
    if not (ignore is None or isinstance(ignore, list) and all(isinstance(x, str) for x in ignore)):
        raise UserError(
            f"{q.where}: its list of unquantized modules must be a list of names ('{key}'), got {ignore!r}"
        )
    text = " ".join(ignore or [])
    return (BF16 if _ATTENTION.search(text) else attn), (BF16 if _EXPERTS.search(text) else experts)


def _compressed_tensors(q: Fields, name: str) -> tuple[WeightFormat, WeightFormat]:
    groups = q.data.get("config_groups") or {}
    require(
        isinstance(groups, dict) and groups,
        f"model config {name}: compressed-tensors quantization_config has no config_groups",
    )
    attn = experts = None
    for key, group in groups.items():
        require(
            isinstance(group, dict) and isinstance(group.get("weights") or {}, dict),
            f"model config {name}: quantization_config.config_groups entries must be JSON objects",
        )
        g = Fields(group, f"{q.where}.config_groups.{key}")
        fmt = _ct_group(g)
        targets = " ".join(g.names("targets", ("Linear",)))
        if _EXPERTS.search(targets):
            experts = fmt
        elif _ATTENTION.search(targets):
            attn = fmt
        else:
            attn, experts = attn or fmt, experts or fmt
    return _apply_ignore(attn or BF16, experts or BF16, q, "ignore")


# compressed-tensors' weight strategies (compressed_tensors QuantizationStrategy)
CT_STRATEGIES = ("group", "channel", "tensor", "block", "tensor_group", "token")


def _ct_group(g: Fields) -> WeightFormat:
    w = g.section("weights") or Fields({}, f"{g.where}.weights")
    acts = g.section("input_activations")
    bits = w.whole("num_bits", 16, 1, 64)
    act_bits = acts.whole("num_bits", 16, 1, 64) if acts else 16
    kind = w.choice("type", "int", ("int", "float"))
    group_size = w.whole("group_size", 0)
    strategy = w.choice("strategy", "group" if group_size else "channel", CT_STRATEGIES)
    if kind == "float" and bits == 4:
        return nvfp4("fp4" if act_bits == 4 else "bf16")
    if kind == "float" and bits == 8:
        block = w.wholes("block_structure", 2) if strategy == "block" else None
        return _fp8(block, 16, "fp8" if act_bits == 8 else "bf16", strategy)
    if kind == "int" and bits in (4, 8):
        gs = group_size if strategy == "group" else 0
        fmt = int_format(bits, gs, not w.flag("symmetric", True), "ct")
        if bits == 8 and act_bits == 8:  # W8A8 int8: the GEMM runs on int8 tensor cores
            fmt = WeightFormat(
                fmt.name.replace("ct-", "ct-w8a8-"),
                "int8",
                8,
                fmt.group,
                fmt.scale_bits,
                fmt.zero_bits,
                compute="int8",
            )
        return fmt
    raise UserError(
        f"{g.where}: compressed-tensors {kind} {bits}-bit weights are not modelled; "
        "supported: int4/int8 (weight-only or W8A8), fp8, nvfp4"
    )


# KV-cache dtypes, as the engines name them: vLLM `--kv-cache-dtype`
# (vllm/config/cache.py CacheDType: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2) and SGLang
# `--kv-cache-dtype` (python/sglang/srt/server_args.py: auto, bf16/bfloat16, fp8_e4m3,
# fp8_e5m2). `auto` is the model's own 16-bit dtype in both (vLLM CacheConfig: "auto"
# uses the model data type; SGLang ModelRunner: kv_cache_dtype = self.dtype when "auto").
KV_CACHE_DTYPES = {
    "auto": "bf16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "bf16",
    "float16": "bf16",
    "half": "bf16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}
KV_BYTES_PER_ELEMENT = {"bf16": 2.0, "fp8": 1.0}


def kv_cache_dtype(value: str | None) -> str:
    """The storage class ("bf16": 2 bytes, fp16 alike; "fp8": 1 byte) of a KV-cache dtype name."""
    if value is None:
        return "bf16"
    key = str(value).lower()
    require(
        key in KV_CACHE_DTYPES,
        f"--kv-cache-dtype '{value}' is not known; allowed: {', '.join(KV_CACHE_DTYPES)}",
    )
    return KV_CACHE_DTYPES[key]

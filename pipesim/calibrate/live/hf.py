"""The model's own Hugging Face transformers code with random weights (no download):
the decode loop's CPU costs per step and per decoder layer (`hf_decode_costs`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ...base.errors import UserError
from ...inputs.model import Model
from ...profiles.tables import sig6
from .specs import Grids
from .timing import import_torch, median

# Extra decoder layers of the deeper of the two HF models (the CPU cost per layer is their slope).
HF_EXTRA_LAYERS = 16


def transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        return "none"
    return transformers.__version__


def hf_transformers_config(cfg: dict, layers: int | None = None) -> Any:
    """The transformers config for an HF config dict (quantization dropped: the weights
    are random bf16), or a UserError saying why transformers cannot build it."""
    try:
        import transformers
    except ImportError:
        raise UserError("--hf-config needs transformers: pip install 'pipesim[live]'") from None
    raw = {
        k: v
        for k, v in cfg.items()
        if not k.startswith("_") and k not in ("quantization_config", "torch_dtype")
    }
    text = raw.pop("text_config", None)
    if isinstance(text, dict):  # multimodal wrappers: the text model is what is served per token
        raw = {
            **{k: v for k, v in text.items() if not k.startswith("_")},
            "model_type": text.get("model_type", ""),
        }
    model_type = raw.pop("model_type", None)
    if not model_type:
        raise UserError("--hf-config: the model config has no 'model_type', so transformers cannot build it")
    if layers is not None:
        raw["num_hidden_layers"] = layers
        raw.pop("layer_types", None)
        if isinstance(raw.get("mlp_only_layers"), list):
            raw["mlp_only_layers"] = [i for i in raw["mlp_only_layers"] if i < layers]
    try:
        return transformers.AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError) as exc:
        raise UserError(
            f"--hf-config: transformers {transformers.__version__} cannot build model_type "
            f"'{model_type}' ({str(exc).splitlines()[0][:120]})"
        ) from None


def build_hf_model(cfg: dict, device: Any, *, layers: int | None = None) -> Any:
    """A transformers causal LM built from an HF config dict with random weights (no
    download), bf16, on `device`, in eval mode. `layers` overrides the depth."""
    torch = import_torch()
    import transformers

    config = hf_transformers_config(cfg, layers)
    with torch.device(device):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        except TypeError:  # transformers 4.x spells it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.to(device=device, dtype=torch.bfloat16).eval()
    gc = model.generation_config
    gc.eos_token_id = None  # never stop early: every run decodes exactly the asked tokens
    gc.pad_token_id = 0
    return model


def generate_once_s(model: Any, batch: int, prompt: int, new_tokens: int, seed: int = 0) -> float:
    """Wall seconds of one `generate` call: greedy, `new_tokens` tokens for each of
    `batch` random prompts of `prompt` tokens, no early stop."""
    torch = import_torch()
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, model.config.vocab_size, (batch, prompt), generator=g).to(device)
    mask = torch.ones_like(ids)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    sync()
    seconds = time.perf_counter() - t
    got = (out.sequences if hasattr(out, "sequences") else out).shape[1] - prompt
    if got != new_tokens:
        raise RuntimeError(f"generate stopped after {got} of {new_tokens} tokens")
    return seconds


def kernel_ms(torch: ModuleType, run: Callable[[], object]) -> float | None:
    """Milliseconds the GPU spent in kernels while `run()` ran (torch.profiler, CUPTI),
    or None where the profiler records no GPU activity."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        total_us = 0.0
        for e in prof.key_averages():
            v = getattr(e, "self_device_time_total", None)
            total_us += float(v if v is not None else getattr(e, "self_cuda_time_total", 0.0))
    except (
        Exception
    ):  # no CUPTI, or a profiler that does not start: report nothing rather than a wrong number
        return None
    return total_us / 1e3 if total_us > 0 else None


def step_wall_ms(model: Any, batch: int, prompt: int, short: int = 8, long: int = 40) -> float:
    """Wall ms of one decode iteration of `generate` at `batch`: a `long` minus a `short`
    run over the extra tokens, which cancels prefill and set-up."""
    return (
        (generate_once_s(model, batch, prompt, long) - generate_once_s(model, batch, prompt, short))
        * 1e3
        / (long - short)
    )


def step_kernel_ms(model: Any, batch: int, prompt: int, short: int = 8, long: int = 40) -> float | None:
    """GPU kernel ms of one decode iteration (profiler), the same difference."""
    torch = import_torch()
    k_long = kernel_ms(torch, lambda: generate_once_s(model, batch, prompt, long))
    k_short = kernel_ms(torch, lambda: generate_once_s(model, batch, prompt, short))
    return None if k_long is None or k_short is None else (k_long - k_short) / (long - short)


def hf_step(
    model: Any,
    batch: int,
    prompt: int,
    short: int = 8,
    long: int = 40,
    repeats: int = 5,
    with_kernels: bool = True,
) -> tuple[float, float | None]:
    """(wall ms, GPU kernel ms) of one decode iteration of `generate` at `batch`,
    the median of `repeats` after two warm-up calls."""
    for _ in range(2):  # warm-up: kernel selection, allocator, generate's first-call set-up
        generate_once_s(model, batch, prompt, short)
    wall = median([step_wall_ms(model, batch, prompt, short, long) for _ in range(repeats)])
    return wall, (step_kernel_ms(model, batch, prompt, short, long) if with_kernels else None)


def hf_decode_costs(
    cfg: dict,
    model: Model,
    device: Any,
    grids: Grids,
    deadline: float,
    log: Callable[[str], None],
    repeats: int = 5,
) -> tuple[dict, list[dict]]:
    """The decode loop's CPU costs from the model's HF implementation.

    Two random-weight models that differ only in depth (La and Lb decoder layers) run
    `generate`, their runs interleaved so that drift in the machine's speed hits both
    alike. At small batch an eager HF decode step is launch-bound (the CPU issues
    kernels more slowly than the GPU runs them: the profiler's kernel time per layer
    is a fraction of the wall time per layer), so the step's wall time is CPU time.
    Its slope over depth is the launch time per decoder layer
    (eager_launch_us_per_layer); the intercept is the per-iteration cost outside the
    layers: generate's Python, embedding, lm_head and sampling launches, the host sync
    (cpu_iteration_ms). Both are taken at the first (smallest) batch size, where the
    step is most purely CPU-bound; larger batches are recorded in the extras (on the
    lent H200 their slopes scattered 0.7-1.2 ms/layer for Llama-8B, batch 1 was the
    one that extrapolated to the full-depth model best). The simulator
    composes an eager step as cpu_iteration_ms + max(GPU time, layers x launch time),
    which is this measurement's own model."""
    torch = import_torch()
    first = model.moe.first_k_dense if model.moe else 0
    layer_bytes = max(model.layer_weight_bytes(i, "bf16") for i in range(min(model.num_layers, first + 1)))
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 8 * 2**30
    la = min(first + 1, model.num_layers)
    room = int(0.6 * free // max(layer_bytes, 1)) - 2 * la  # both models stay resident
    lb = min(la + max(1, min(HF_EXTRA_LAYERS, room)), model.num_layers)
    if lb == la:
        raise UserError(
            f"--hf-config: {model.name} has one layer, so launch time per layer cannot be separated"
        )
    models = {d: build_hf_model(cfg, device, layers=d) for d in (la, lb)}
    impl = (
        str(getattr(models[la].config, "_attn_implementation", "")),
        str(getattr(models[la].config, "_experts_implementation", "")) if model.moe else "",
    )
    rows: list[dict] = []
    seen: dict = {}
    for b in grids.hf_batches:
        if seen and time.monotonic() > deadline:
            log(f"HF batch {b}: skipped (budget)")
            continue
        for m in models.values():  # warm-up: kernel selection, allocator growth, first-call set-up
            for n in (8, 40):
                generate_once_s(m, b, grids.hf_prompt, n)
        walls: dict = {la: [], lb: []}
        for _ in range(repeats + (2 if not seen else 0)):  # the batch the parameters come from: more
            for d in (la, lb):
                walls[d].append(step_wall_ms(models[d], b, grids.hf_prompt))
        slope = median([(wb - wa) / (lb - la) for wa, wb in zip(walls[la], walls[lb])])
        wall_a = median(walls[la])
        ka, kb = (step_kernel_ms(models[d], b, grids.hf_prompt) for d in (la, lb))
        k_layer = None if ka is None or kb is None else (kb - ka) / (lb - la)
        seen[b] = (wall_a, slope, ka, kb, k_layer)
        params = f"batch={b};context={grids.hf_prompt};layers={la}->{lb}"
        rows.append({"op": "hf_layer_wall", "params": params, "value": sig6(slope), "unit": "ms"})
        if k_layer is not None:
            rows.append({"op": "hf_layer_kernels", "params": params, "value": sig6(k_layer), "unit": "ms"})
        rows.append(
            {
                "op": "hf_step_wall",
                "params": f"batch={b};context={grids.hf_prompt};layers={la}",
                "value": sig6(wall_a),
                "unit": "ms",
            }
        )
    del models
    if device.type == "cuda":
        torch.cuda.empty_cache()
    bound = list(seen)[:1]
    per_layer_ms = seen[bound[0]][1]
    if per_layer_ms <= 0:
        log(
            f"HF decode step did not grow with depth ({la} -> {lb} layers): timing noise; "
            "eager_launch_us_per_layer set to 0"
        )
        per_layer_ms = 0.0
    fixed_ms = max(median([seen[b][0] - la * per_layer_ms for b in bound]), 0.0)
    b0 = list(seen)[0]
    costs = {
        "cpu_iteration_ms": round(fixed_ms, 4),
        "eager_launch_us_per_layer": round(per_layer_ms * 1e3, 2),
        "layers": (la, lb),
        "batches": bound,
        "impl": impl,
        "step_ms": (round(seen[b0][0], 4), round(seen[b0][0] + (lb - la) * seen[b0][1], 4)),
        "kernel_ms": tuple(None if k is None else round(k, 4) for k in seen[b0][2:4]),
    }
    return costs, rows

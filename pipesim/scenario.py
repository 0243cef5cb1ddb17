"""A scenario: every input of one prediction, validated and resolved.

Box, model, parallel plan, engine knobs (resolved to the values the engine would run
with), workload and calibration profile. Knobs are resolved in this order: what the
user gave, else the launch flags of the profile's measured deployment, else the
engine's own default (docs/engines.md §7). A deployment flag the engine derives from
a knob the user gave is not taken from the profile: with `--max-running-requests`
alone, SGLang's per-slot cap is `max_running_requests // pp` again. Every resolved
knob says where it came from (`Scenario.knob_sources`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from .engines import ENGINES
from .errors import UserError, require
from .hardware import Box, cluster, load_box, load_network
from .memory import Memory, plan_memory
from .model import Model, load_model
from .plan import Plan, make_plan
from .quantization import kv_cache_dtype as resolve_kv_cache_dtype
from .workload import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, Workload, closed_loop, from_trace, poisson

if TYPE_CHECKING:  # profiles load pandas: imported where one is loaded, so the CLI starts without it
    from .profile import Profile

DEFAULT_PROFILE = "rtx-pro-6000-sglang-deployment"
DEFAULT_MODEL = "kimi-k2.6"


@dataclass(frozen=True)
class Scenario:
    box: Box
    model: Model
    plan: Plan
    engine: object          # SGLangConfig | VLLMConfig, as given
    settings: object        # SGLangSettings | VLLMSettings, resolved
    memory: Memory
    workload: Workload
    profile: Profile
    knob_sources: dict = field(default_factory=dict)   # knob -> "user" | "profile deployment" | "engine default"
    whatif: dict = field(default_factory=dict)   # what-if knobs given (whatif.py), as given

    def describe(self) -> dict:
        """Every resolved input, for reports and --json."""
        m = self.memory
        return {
            "box": self.box.name,
            "gpu": self.box.gpu.name,
            "model": self.model.name,
            "profile": self.profile.name,
            "tp": self.plan.tp,
            "pp": self.plan.pp,
            "layers_per_stage": list(self.plan.layers_per_stage),
            "engine": self.settings.describe(),
            "knob_sources": dict(self.knob_sources),
            "workload": self.workload.describe(),
            "weights_per_gpu_gib": [round(w / 2**30, 2) for w in m.weights_per_gpu_bytes],
            "kv_cache_tokens": m.kv_tokens,
            **({"kv_cache_dtype": self.model.kv_cache_dtype} if self.model.kv_cache_dtype != "bf16" else {}),
            **({"nodes": self.box.nodes, "gpus_per_node": self.box.gpus_per_node, "network": self.box.network.name}
               if self.box.nodes > 1 else {}),
            **({"whatif": dict(self.whatif)} if self.whatif else {}),
            "profile_params": {f.name: getattr(self.profile.params, f.name) for f in fields(self.profile.params)},
        }


def build_scenario(*, tp: int = 1, pp: int = 1, concurrency: int | None = None, model: str | Model = DEFAULT_MODEL,
                   profile: str | Profile = DEFAULT_PROFILE, engine: str | None = None, box: str | Box | None = None,
                   layers: tuple[int, ...] | None = None, rate_rps: float | None = None,
                   num_requests: int | None = None, trace: str | None = None,
                   input_len: str | int = DEFAULT_INPUT_LEN, output_len: str | int = DEFAULT_OUTPUT_LEN,
                   seed: int = 0, nodes: int = 1, network: str | None = None, kv_cache_dtype: str | None = None,
                   kernel_scale: float | None = None, allreduce_scale: float | None = None,
                   pcie_bandwidth_scale: float | None = None, cpu_iteration_ms: float | None = None,
                   **knobs) -> Scenario:
    from .whatif import apply_box, apply_profile, check
    from .profile import Profile, load_profile

    changes = check(dict(kernel_scale=kernel_scale, allreduce_scale=allreduce_scale,
                         pcie_bandwidth_scale=pcie_bandwidth_scale, cpu_iteration_ms=cpu_iteration_ms))
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    prof = apply_profile(prof, changes)
    engine_name = engine or prof.engine
    require(engine_name in ENGINES, f"unknown engine '{engine_name}'; known: {', '.join(ENGINES)}")
    config_cls = ENGINES[engine_name]
    allowed = {f.name for f in fields(config_cls)}
    unknown = sorted(k for k, v in knobs.items() if v is not None and k not in allowed)
    require(not unknown, f"{', '.join(unknown)} is not a {engine_name} knob; {engine_name} knobs: {', '.join(sorted(allowed))}")
    given = {k: v for k, v in knobs.items() if v is not None and k in allowed}
    derived = {k for g in given for k in getattr(config_cls, "derived_from", {}).get(g, ())}
    deployed = ({k: v for k, v in prof.deployment.items() if k in allowed and k not in given and k not in derived}
                if engine_name == prof.engine else {})
    config = config_cls(**{**deployed, **given})
    config.validate()
    sources = {k: "user" if k in given else "profile deployment" if k in deployed else "engine default"
               for k in sorted(allowed)}

    bx = box if isinstance(box, Box) else load_box(box or prof.box)
    if nodes != 1 or network is not None:   # a cluster of identical boxes (hardware.cluster)
        bx = cluster(bx, nodes, load_network(network) if network is not None else None)
    bx = apply_box(bx, changes)
    mdl = model if isinstance(model, Model) else load_model(model)
    if kv_cache_dtype is not None:      # engine flag --kv-cache-dtype; auto = the model's 16-bit dtype
        mdl = replace(mdl, kv_cache_dtype=resolve_kv_cache_dtype(kv_cache_dtype))
    plan = make_plan(tp, pp, mdl.num_layers, bx.gpu_count, config.partition_rule, layers)
    mdl.check_tp(tp)
    fraction = config.memory_fraction(bx.gpu.memory_bytes, tp, pp)
    memory = plan_memory(bx, mdl, plan, fraction, engine_name)

    workload = _workload(concurrency, rate_rps, num_requests, trace, input_len, output_len, seed)
    need = workload.max_request_tokens
    require(memory.kv_tokens >= need,
            f"the KV cache holds {memory.kv_tokens} tokens at tp={tp} pp={pp}, but one request needs {need} "
            f"(input + output); shorten the request or use more GPUs")
    settings = config.resolve(bx.gpu.memory_bytes, plan, mdl, memory.kv_tokens)
    return Scenario(bx, mdl, plan, config, settings, memory, workload, prof, sources, whatif=changes)


def _workload(concurrency, rate_rps, num_requests, trace, input_len, output_len, seed) -> Workload:
    require(isinstance(seed, int) and seed >= 0, f"seed must be a whole number >= 0, got {seed}")
    given = [n for n, v in (("concurrency", concurrency), ("rate", rate_rps), ("trace", trace)) if v is not None]
    require(len(given) <= 1, f"give one of concurrency, rate or trace, not {' and '.join(given)}")
    if trace is not None:
        require(num_requests is None or num_requests >= 1, f"number of requests must be >= 1, got {num_requests}")
        return from_trace(trace, num_requests or 0, seed)
    if rate_rps is not None:
        return poisson(rate_rps, 200 if num_requests is None else num_requests, input_len, output_len, seed)
    if concurrency is None:
        raise UserError("give a concurrency (--conc), an arrival rate (--rate) or a trace (--trace)")
    return closed_loop(concurrency, input_len, output_len, seed)

"""A scenario: every input of one prediction, validated and resolved.

Box, model, parallel plan, engine knobs (resolved to the values the engine would run
with), workload and calibration profile. Knobs are resolved in this order: what the
user gave, else the launch flags of the profile's measured deployment, else the
engine's own default (docs/engines.md §7). A deployment flag the engine derives from
a knob the user gave is not taken from the profile: with `--max-running-requests`
alone, SGLang's per-slot cap is `max_running_requests // pp` again. Every resolved
knob says where it came from (`Scenario.knob_sources`).

The profile is what the user named (its box, engine and model the defaults), else the
one measured for the box asked for (`catalogue.profile_for_box`). A profile measured on
another box, GPU or engine is refused (`foreign_reasons`) unless allowed, and then its
costs are reported as borrowed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, fields, replace
from os import PathLike
from typing import TYPE_CHECKING

from ..base.checks import (
    MAX_CONCURRENCY,
    MAX_GPUS,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SIM_S,
    batch_steps,
    check_work,
    is_int,
    is_number,
    not_empty,
    whole,
)
from ..base.errors import PipesimWarning, UserError, require
from ..engines import ENGINES
from ..engines.knobs import check_values, knob_names
from ..inputs.box import Box, cluster, load_box, load_network
from ..inputs.memory import Memory, plan_memory
from ..inputs.model import Model, load_model
from ..inputs.plan import Plan, make_plan
from ..inputs.quantization import kv_cache_dtype as resolve_kv_cache_dtype
from ..inputs.routing import exponent
from ..inputs.workload import (
    DEFAULT_INPUT_LEN,
    DEFAULT_OUTPUT_LEN,
    Workload,
    closed_loop,
    from_trace,
    poisson,
)
from ..profiles.hostloop import check_version, newest, with_host_defaults
from .aliases import with_aliases

if TYPE_CHECKING:  # profiles load pandas: imported where one is loaded, so the CLI starts without it
    from ..engines.protocol import EngineConfig, EngineSettings
    from ..profiles.profile import Profile

DEFAULT_MODEL = "kimi-k2.6"


@dataclass(frozen=True)
class Scenario:
    box: Box
    model: Model
    plan: Plan
    engine: EngineConfig  # the knobs as given
    settings: EngineSettings  # resolved to the values the engine would run with
    memory: Memory
    workload: Workload
    profile: Profile
    knob_sources: dict = field(
        default_factory=dict
    )  # knob -> "user" | "profile deployment" | "engine default"
    whatif: dict = field(default_factory=dict)  # what-if knobs given (whatif.py), as given
    engine_version: str = ""  # the engine release whose host loop and rules run (releases.py)

    def describe(self) -> dict:
        """Every resolved input, for reports and --json."""
        m, net = self.memory, self.box.network
        return {
            "box": self.box.name,
            "gpu": self.box.gpu.name,
            "model": self.model.name,
            "profile": self.profile.name,
            "tp": self.plan.tp,
            "pp": self.plan.pp,
            "layers_per_stage": list(self.plan.layers_per_stage),
            **(
                {
                    "dp": self.plan.dp,
                    "ep": self.plan.ep,
                    "dp_attention": self.plan.dp_attention,
                    "attn_tp": self.plan.attn_tp,
                    "moe_tp": self.plan.moe_tp,
                    "moe_a2a": self.plan.moe_a2a,
                    "gpus": self.plan.gpus,
                }
                if self.plan.dp > 1 or self.plan.ep > 1
                else {}
            ),
            "engine": self.settings.describe(),
            "engine_version": self.engine_version,
            "host_loop": dict(self.profile.meta.get("host_loop", {})),
            "knob_sources": dict(self.knob_sources),
            "workload": self.workload.describe(),
            "weights_per_gpu_gib": [round(w / 2**30, 2) for w in m.weights_per_gpu_bytes],
            "kv_cache_tokens": m.kv_tokens,
            "kv_reservation": m.describe(self.box.gpu.memory_bytes),
            **({"kv_cache_dtype": self.model.kv_cache_dtype} if self.model.kv_cache_dtype != "bf16" else {}),
            **(
                {
                    "nodes": self.box.nodes,
                    "gpus_per_node": self.box.gpus_per_node,
                    "network": net.name,
                }
                if self.box.nodes > 1 and net is not None  # a cluster: boxes joined by a network
                else {}
            ),
            **({"whatif": dict(self.whatif)} if self.whatif else {}),
            "profile_params": {
                f.name: getattr(self.profile.params, f.name) for f in fields(self.profile.params)
            },
            "param_sources": dict(self.profile.meta.get("param_sources", {})),
            **(
                {"table_sources": dict(self.profile.meta["table_sources"])}
                if "table_sources" in self.profile.meta
                else {}
            ),
            **({"profile_foreign": self.profile.foreign} if self.profile.foreign else {}),
        }


def foreign_reasons(profile: Profile, box: Box, engine: str) -> list[str]:
    """What differs between where a profile was measured and the run it would cost:
    its box (the one-node box, for a cluster), the box's GPU, the engine."""
    measured_on = profile.box_spec if isinstance(profile.box_spec, Box) else load_box(profile.box)
    out = []
    if measured_on.gpu.name != box.gpu.name:
        out.append(f"GPU {measured_on.gpu.name} vs {box.gpu.name}")
    if measured_on.name != box.name:
        out.append(f"box {measured_on.name} vs {box.name}")
    if profile.engine != engine:
        out.append(f"engine {profile.engine} vs {engine}")
    return out


@with_aliases
def build_scenario(
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    ep: int = 1,
    dp_attention: bool = False,
    enable_expert_parallel: bool = False,
    moe_a2a_backend: str | None = None,
    moe_distribution: str | None = None,
    concurrency: int | None = None,
    model: str | Model | None = None,
    profile: str | Profile | None = None,
    engine: str | None = None,
    box: str | Box | None = None,
    layers: tuple[int, ...] | None = None,
    rate_rps: float | None = None,
    num_requests: int | None = None,
    trace: str | None = None,
    input_len: str | int = DEFAULT_INPUT_LEN,
    output_len: str | int = DEFAULT_OUTPUT_LEN,
    seed: int = 0,
    nodes: int = 1,
    network: str | None = None,
    kv_cache_dtype: str | None = None,
    kernel_scale: float | None = None,
    allreduce_scale: float | None = None,
    pcie_bandwidth_scale: float | None = None,
    cpu_iteration_ms: float | None = None,
    engine_version: str | None = None,
    allow_foreign_profile: bool = False,
    **knobs: object,
) -> Scenario:
    """Every input of one prediction, checked and resolved (one UserError line on bad
    input). `knobs`: the engine's knobs by name, each declared on its config field
    (engines/knobs.py; docs/engines.md §7); None or absent: the profile's deployment
    value, else the engine's default. Aliases: aliases.py (rate=, tensor_parallel_size=)."""
    from .whatif import apply_box, apply_profile, check

    tp, pp = whole(tp, "tp", 1, MAX_GPUS), whole(pp, "pp", 1, MAX_GPUS)
    dp, ep = whole(dp, "dp", 1, MAX_GPUS), whole(ep, "ep", 1, MAX_GPUS)
    for flag, v in (("dp_attention", dp_attention), ("enable_expert_parallel", enable_expert_parallel)):
        require(isinstance(v, bool), f"{flag} must be true or false, got {v!r}")
    nodes = whole(nodes, "--nodes", 1)  # its limit is on the GPUs it makes (hardware.cluster)
    not_empty(model=model, profile=profile, box=box, engine=engine, trace=trace, network=network)
    not_empty(engine_version=engine_version, kv_cache_dtype=kv_cache_dtype)
    not_empty(moe_distribution=moe_distribution, moe_a2a_backend=moe_a2a_backend)
    if layers is not None:
        require(
            isinstance(layers, (tuple, list)) and all(is_int(n) for n in layers),
            f"--layers {layers!r} must be comma-separated whole numbers, e.g. 7,7,7,8,8,8,8,8",
        )
        layers = tuple(int(n) for n in layers)
    changes = check(
        dict(
            kernel_scale=kernel_scale,
            allreduce_scale=allreduce_scale,
            pcie_bandwidth_scale=pcie_bandwidth_scale,
            cpu_iteration_ms=cpu_iteration_ms,
        )
    )
    require(engine is None or engine in ENGINES, f"unknown engine '{engine}'; known: {', '.join(ENGINES)}")
    require(
        engine_version is None or isinstance(engine_version, str),
        f"--engine-version {engine_version!r} must be a version string, e.g. 0.6.3",
    )
    prof, bx = _profile_and_box(profile, box, engine, model, engine_version)
    if moe_distribution is not None:  # the routing the MoE tables are read at (moe.py)
        exponent(moe_distribution, "--moe-distribution")
        prof = prof.with_params(moe_distribution=moe_distribution)
    engine_name = engine or prof.engine
    require(engine_name in ENGINES, f"unknown engine '{engine_name}'; known: {', '.join(ENGINES)}")
    # the engine release: as given, else the profile's, else the newest modelled; it picks
    # the host loop's defaults (profiles/hostloop.py) and rules (engines/releases.py)
    own = prof.engine_version if prof.engine == engine_name else ""
    version = check_version(engine_name, engine_version or own or newest(engine_name))
    prof = apply_profile(with_host_defaults(prof, engine_name, version), changes)
    prof = _borrowed(prof, bx, engine_name, allow_foreign_profile)
    if model is None:
        model = str(prof.meta.get("model", DEFAULT_MODEL))
    config, sources = _engine_config(engine_name, prof, knobs)

    if nodes != 1 or network is not None:  # a cluster of identical boxes (hardware.cluster)
        bx = cluster(bx, nodes, load_network(network) if network is not None else None)
    bx = apply_box(bx, changes)
    mdl = model if isinstance(model, Model) else load_model(model)
    prof = _launch_for_model(prof, mdl)
    if kv_cache_dtype is not None:  # engine flag --kv-cache-dtype; auto = the model's 16-bit dtype
        mdl = replace(mdl, kv_cache_dtype=resolve_kv_cache_dtype(kv_cache_dtype))
    plan = make_plan(
        tp,
        pp,
        mdl.num_layers,
        bx.gpu_count,
        config.partition_rule,
        layers,
        dp=dp,
        ep=ep,
        dp_attention=dp_attention,
        enable_expert_parallel=enable_expert_parallel,
        num_experts=mdl.moe.n_routed_experts if mdl.moe else 0,
        moe_a2a="none" if moe_a2a_backend is None else moe_a2a_backend,
    )
    mdl.check_plan(plan)
    memory = plan_memory(bx, mdl, plan, config.memory_rule(bx, plan, mdl, version))

    workload = _workload(concurrency, rate_rps, num_requests, trace, input_len, output_len, seed)
    need = workload.max_request_tokens
    require(
        memory.kv_tokens >= need,
        f"the KV cache holds {memory.kv_tokens} tokens at tp={tp} pp={pp}, but one request needs {need} "
        f"(input + output); shorten the request or use more GPUs",
    )
    require(
        need <= mdl.max_context,
        f"one request needs {need} tokens (input + output), above the model's context of {mdl.max_context} "
        f"(max_position_embeddings of {mdl.name}); shorten the request",
    )
    settings = config.resolve(bx.gpu.memory_bytes, plan, mdl, memory.kv_tokens, version)
    scenario = Scenario(
        bx,
        mdl,
        plan,
        config,
        settings,
        memory,
        workload,
        prof,
        sources,
        whatif=changes,
        engine_version=version,
    )
    check_work(*scenario_steps(scenario))
    return scenario


def _profile_and_box(
    profile: str | Profile | None,
    box: str | Box | None,
    engine: str | None,
    model: str | Model | None,
    engine_version: str | None,
) -> tuple[Profile, Box]:
    """The profile the user named (its box the default), else the one measured for the
    box and engine asked for (catalogue.profile_for_box; the default box if none)."""
    from ..profiles.catalogue import profile_for_box
    from ..profiles.profile import DEFAULT_PROFILE, Profile, load_profile

    if profile is None:
        default_engine = load_profile(DEFAULT_PROFILE).engine
        if box is not None or engine not in (None, default_engine):
            bx = box if isinstance(box, Box) else load_box(box or load_profile(DEFAULT_PROFILE).box)
            model_name = model.name if isinstance(model, Model) else (model or DEFAULT_MODEL)
            return profile_for_box(bx, engine or default_engine, model_name, engine_version), bx
    # a named profile keeps its own tables: the version asked picks the host loop's rules
    prof = profile if isinstance(profile, Profile) else load_profile(profile or DEFAULT_PROFILE)
    return prof, box if isinstance(box, Box) else load_box(box or prof.box)


def _launch_for_model(prof: Profile, mdl: Model) -> Profile:
    """A profile's own `eager_launch_us_per_layer` was measured or fitted on its model's
    layers; another model's layers launch their own kernels (costs/host.py: kernels per
    layer x launch_us_per_kernel)."""
    own = prof.meta.get("model")
    if not prof.params.eager_launch_us_per_layer or not own or own == mdl.name:
        return prof
    note = (
        f"not used: measured per layer of {own}; {mdl.name}'s layers launch their own kernels (costs/host.py)"
    )
    sources = {**prof.meta.get("param_sources", {}), "eager_launch_us_per_layer": note}
    return replace(
        prof,
        params=replace(prof.params, eager_launch_us_per_layer=0.0),
        meta={**prof.meta, "param_sources": sources},
    )


def _borrowed(prof: Profile, bx: Box, engine: str, allowed: bool) -> Profile:
    """`prof` itself when it was measured on this box with this engine; else refused,
    unless borrowing is allowed: then marked foreign (its costs reported as borrowed)."""
    differs = foreign_reasons(prof, bx, engine)
    if not differs:
        return prof
    require(
        allowed,
        f"profile {prof.name} was measured on {prof.box} with {prof.engine}, not this run's {bx.name} with "
        f"{engine} ({'; '.join(differs)}); leave out --profile to use this box's own tables, "
        "or pass --allow-foreign-profile to borrow them",
    )
    warnings.warn(
        f"borrowing profile {prof.name} ({'; '.join(differs)}): its costs are reported as borrowed",
        PipesimWarning,
        stacklevel=3,
    )
    return replace(prof, foreign="; ".join(differs))


def _engine_config(engine: str, prof: Profile, knobs: dict) -> tuple[EngineConfig, dict[str, str]]:
    """The engine's knobs resolved (docs/engines.md §7): what the user gave, else the
    profile's deployment flags (on its own engine, and not a knob the engine derives
    from one the user gave), else the engine's default; and where each came from."""
    config_cls = ENGINES[engine]
    allowed = knob_names(config_cls)  # its declared knobs (engines/knobs.py)
    unknown = sorted(k for k, v in knobs.items() if v is not None and k not in allowed)
    require(not unknown, f"{', '.join(unknown)} is not a {engine} knob; {engine} knobs: {', '.join(allowed)}")
    given = {k: v for k, v in knobs.items() if v is not None and k in allowed}
    derived = {k for g in given for k in config_cls.derived_from.get(g, ())}
    deployed = (
        {k: v for k, v in prof.deployment.items() if k in allowed and k not in given and k not in derived}
        if engine == prof.engine
        else {}
    )
    config = config_cls(**check_values(config_cls, {**deployed, **given}))
    config.validate()
    sources = {
        k: "user" if k in given else "profile deployment" if k in deployed else "engine default"
        for k in allowed
    }
    return config, sources


def scenario_steps(sc: Scenario) -> tuple[float, str]:
    """The decode batch steps of a scenario's run (`workload_steps`): a batch holds at most
    the engine's cap of requests, every request counted at its largest (admission.py)."""
    from .admission import admission

    return workload_steps(sc.workload, admission(sc.workload, sc.settings, sc.plan.dp, "max").cap)


def workload_steps(w: Workload, running_cap: int) -> tuple[float, str]:
    """The decode batch steps a run of `w` takes at most `running_cap` requests a batch
    (checks.batch_steps), and how they were counted: a lower bound, as batches run
    below the cap while they fill and drain."""
    if w.kind == "closed":
        n = w.concurrency + max(2 * w.concurrency, 16)  # warm-up + the least measured (api.simulate)
        return batch_steps(
            n, w.output_len.hi, min(w.concurrency, running_cap)
        ), f"{n} requests x {w.output_len.hi} output tokens / batch {min(w.concurrency, running_cap)}"
    n = w.num_requests if w.kind == "poisson" else len(w.trace)
    out = n * w.output_len.hi if w.kind == "poisson" else sum(o for _, _, o in w.trace)
    batch = min(n, running_cap)
    return batch_steps(1, out, batch), f"{n} requests, {out} output tokens / batch {batch}"


def _workload(
    concurrency: int | None,
    rate_rps: float | None,
    num_requests: int | None,
    trace: str | None,
    input_len: str | int,
    output_len: str | int,
    seed: int,
) -> Workload:
    """The workload build_scenario's keywords describe, each checked (a caller may pass
    anything: the types are what is accepted, not what arrives)."""
    require(
        is_int(seed) and 0 <= seed < MAX_SEED, f"seed must be a whole number >= 0 and < 2**63, got {seed!r}"
    )
    seed = int(seed)
    given = [
        n for n, v in (("concurrency", concurrency), ("rate", rate_rps), ("trace", trace)) if v is not None
    ]
    require(len(given) <= 1, f"give one of concurrency, rate or trace, not {' and '.join(given)}")
    for what, v in (("input length", input_len), ("output length", output_len)):
        require(
            isinstance(v, str) or is_int(v),
            f"{what} {v!r} is not a token count; allowed: N (fixed) or LO:HI (uniform), whole numbers >= 1",
        )
    require(
        num_requests is None or (is_int(num_requests) and 1 <= num_requests <= MAX_REQUESTS),
        f"number of requests must be >= 1 and at most {MAX_REQUESTS} (the limit), got {num_requests!r}",
    )
    require(
        num_requests is None or concurrency is None,
        "--num-requests counts requests of --rate or --trace; a closed loop (--conc) runs until its "
        "throughput is measured (api.simulate's measure_requests sets how many)",
    )
    if concurrency is not None:
        concurrency = whole(concurrency, "concurrency", 1, MAX_CONCURRENCY)
    if rate_rps is not None:
        require(
            is_number(rate_rps) and math.isfinite(rate_rps) and rate_rps > 0,
            f"arrival rate must be > 0 requests/s and finite, got {rate_rps!r}",
        )
        n = 200 if num_requests is None else int(num_requests)
        require(
            n / rate_rps <= MAX_SIM_S,
            f"at {rate_rps:g} requests/s, {n} requests arrive over about {n / rate_rps:.3g} s, past the simulated "
            f"horizon of {MAX_SIM_S:g} s; raise the rate or send fewer requests",
        )
        rate_rps = float(rate_rps)
    if trace is not None:
        require(isinstance(trace, (str, PathLike)), f"trace must be the path of a CSV file, got {trace!r}")
        return from_trace(trace, num_requests or 0, seed)
    if rate_rps is not None:
        return poisson(rate_rps, 200 if num_requests is None else num_requests, input_len, output_len, seed)
    if concurrency is None:
        raise UserError("give a concurrency (--conc), an arrival rate (--rate) or a trace (--trace)")
    return closed_loop(concurrency, input_len, output_len, seed)

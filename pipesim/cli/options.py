"""What the commands share: the scenario and engine flags, and the parsers of list-valued
flags (one clear line on bad input, see docs/bad-input.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import click

from ..base.checks import MAX_GPUS, MAX_WORKERS, whole
from ..base.errors import UserError, require
from ..engines import ENGINES
from ..engines.knobs import by_name
from ..explore.sweep import DEFAULT_CONC
from ..inputs.workload import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN
from ..profiles.profile import DEFAULT_PROFILE
from ..scenario.build import DEFAULT_MODEL

F = TypeVar("F", bound=Callable[..., object])  # a click command


def apply_options(f: F, options: list) -> F:
    """Decorate `f` with click options so that `--help` lists them in the order given."""
    for option in reversed(options):
        f = option(f)
    return f


DEFAULT_CONC_TEXT = ",".join(map(str, DEFAULT_CONC))


def parse_layers(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise UserError(
            f"--layers '{value}' must be comma-separated whole numbers, e.g. 7,7,7,8,8,8,8,8"
        ) from None


def parse_ints(text: str, what: str, limit: int = MAX_GPUS) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; each from 1 to `limit`, at least one (the sweep checks them again)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise UserError(f"{what} '{text}' must be comma-separated whole numbers >= 1, e.g. 1,8,32") from None
    require(len(values) > 0, f"{what} is empty; give at least one whole number >= 1, e.g. 1,8,32")
    for v in values:
        require(v >= 1, f"{what}: {v!r} is not a whole number >= 1")
        require(v <= limit, f"{what}: {v} is above the limit of {limit}")
    return sorted(set(values))


def parse_floats(text: str, what: str) -> list[float]:
    """'0.5,1,2' -> [0.5, 1.0, 2.0]; each a finite number > 0, at least one."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise UserError(f"{what} '{text}' must be comma-separated numbers > 0, e.g. 0.5,1,2") from None
    require(len(values) > 0, f"{what} is empty; give at least one number > 0, e.g. 0.5,1,2")
    for v in values:
        require(0 < v < float("inf"), f"{what}: {v:g} is not a number > 0")
    return sorted(set(values))


def parse_splits(text: str | None) -> list[tuple[int, int]] | None:
    """'2x4,8x1' -> [(2, 4), (8, 1)] (TP x PP)."""
    if text is None:
        return None
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            tp, pp = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise UserError(
                f"--splits '{text}': '{part}' is not TPxPP; allowed: comma-separated TPxPP with whole "
                "numbers >= 1, e.g. 2x4,8x1"
            ) from None
        require(tp >= 1 and pp >= 1, f"--splits '{text}': '{part}' needs TP >= 1 and PP >= 1")
        out.append((tp, pp))
    require(len(out) > 0, "--splits is empty; give TPxPP pairs, e.g. 2x4,8x1")
    return sorted(set(out))


def parse_number(text: str | None, what: str) -> float | None:
    """An optional number >= 0 given on the command line."""
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"{what} '{text}' is not a number") from None
    require(math.isfinite(v) and v >= 0, f"{what} must be a finite number >= 0, got {text}")
    return v


def parse_workers(workers: int | None) -> int | None:
    """--workers: unset (every core) or a whole number from 1 to MAX_WORKERS."""
    return None if workers is None else whole(workers, "--workers", 1, MAX_WORKERS)


def scenario_options(f: F, lists: bool = False) -> F:
    """The scenario and engine flags every simulating command shares; with `lists` (a
    sweep's), --engine, --box, --input-len and --output-len take comma-separated lists."""
    several = lambda example: f", or several: {example}" if lists else ""  # noqa: E731
    options = [
        click.option(
            "--model",
            default=None,
            help=f"preset name or path of a Hugging Face config.json (the profile's if it names one) [default: {DEFAULT_MODEL}]",
        ),
        click.option(
            "--profile",
            default=None,
            help=f"calibration profile name or directory (with --box: the box's own, see docs/boxes.md) [default: {DEFAULT_PROFILE}]",
        ),
        click.option(
            "--engine",
            type=None if lists else click.Choice(["sglang", "vllm"]),
            default=None,
            metavar="ENGINE[,..]" if lists else None,
            help=f"engine{several('sglang,vllm')} [default: the profile's]",
        ),
        click.option(
            "--engine-version",
            default=None,
            help="the engine release: its host loop and scheduling rules (docs/engines.md §10) and, with --box and "
            "no --profile, the measured tables of that version where AIConfigurator has them "
            "[default: the profile's, else the newest modelled]",
        ),
        click.option(
            "--allow-foreign-profile",
            is_flag=True,
            default=False,
            help="run a profile measured on another box, GPU or engine (its costs reported as borrowed)",
        ),
        click.option(
            "--box", default=None, help=f"box preset or .toml{several('BOX,BOX')} [default: the profile's]"
        ),
        click.option(
            "--nodes",
            type=int,
            default=1,
            show_default=True,
            help="a cluster of this many identical boxes (GPUs numbered node-major)",
        ),
        click.option(
            "--network",
            default=None,
            help="what joins the nodes: ib-ndr-400, roce-200, eth-100, ... [default: the box's [network]]",
        ),
        click.option(
            "--kv-cache-dtype",
            default=None,
            help="KV-cache dtype, as the engines name it: auto (the model's 16-bit dtype), bf16, fp16, "
            "fp8, fp8_e4m3, fp8_e5m2 [default: auto]",
        ),
        click.option(
            "--input-len",
            default=DEFAULT_INPUT_LEN,
            show_default=True,
            help=f"prompt tokens: N or LO:HI (uniform){several('256,1024')}",
        ),
        click.option(
            "--output-len",
            default=DEFAULT_OUTPUT_LEN,
            show_default=True,
            help=f"output tokens: N or LO:HI (uniform){several('128,512')}",
        ),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="random seed, a whole number >= 0"
        ),
        *knob_options(),
        click.option(
            "--kernel-scale",
            type=float,
            default=None,
            help="what-if: every kernel takes this many times its calibrated time (0.5: a GPU twice as fast)",
        ),
        click.option(
            "--allreduce-scale",
            type=float,
            default=None,
            help="what-if: every TP collective takes this many times its calibrated time",
        ),
        click.option(
            "--pcie-bandwidth-scale",
            type=float,
            default=None,
            help="what-if: every link of the box carries this many times its bandwidth",
        ),
        click.option(
            "--cpu-iteration-ms",
            type=float,
            default=None,
            help="what-if: extra scheduler CPU time per loop iteration, on top of the host loop's terms "
            "(docs/host-loop.md) [default: the profile's]",
        ),
        click.option(
            "--moe-distribution",
            default=None,
            metavar="balanced|power_law_S",
            help="expert routing: balanced, or expert popularity ~ rank^-S (power_law_1.01, power_law_1.2: "
            "the measured tables' rows) [default: the profile's]",
        ),
        click.option(
            "--moe-a2a-backend",
            "--all2all-backend",
            "moe_a2a_backend",
            default=None,
            help="expert parallel's token traffic: none / allgather_reducescatter (the engines' default), "
            "or deepep / pplx / alltoall (dispatch and combine all-to-all) [default: none]",
        ),
    ]
    return apply_options(f, options)


def sweep_scenario_options(f: F) -> F:
    """The scenario flags of a sweep: engine, box and lengths may be lists (`list_kwargs`)."""
    return scenario_options(f, lists=True)


def parallel_options(f: F) -> F:
    """Data and expert parallel flags, with the engines' own names (docs/parallel.md)."""
    options = [
        click.option(
            "--dp",
            "-dp",
            "--data-parallel-size",
            "--dp-size",
            "dp",
            type=int,
            default=1,
            show_default=True,
            help="data-parallel ranks (vLLM: tp x pp x dp GPUs; SGLang: tp x pp with --enable-dp-attention)",
        ),
        click.option(
            "--ep",
            "--ep-size",
            "--expert-parallel-size",
            "ep",
            type=int,
            default=1,
            show_default=True,
            help="expert-parallel size of the MoE layers (SGLang: divides tp; vLLM: dp x tp)",
        ),
        click.option(
            "--enable-dp-attention", is_flag=True, help="SGLang: the dp ranks split each stage's tp GPUs"
        ),
        click.option(
            "--enable-expert-parallel",
            "-ep",
            is_flag=True,
            help="expert parallel over every GPU an MoE layer spans (vLLM: dp x tp; SGLang: tp); -ep is "
            "vLLM's short form of this switch (SGLang's --ep is the size above)",
        ),
    ]
    return apply_options(f, options)


PARALLEL_FLAGS = ("dp", "ep", "enable_dp_attention", "enable_expert_parallel")


def parallel_kwargs(opts: dict) -> dict:
    """The parallel flags as `build_scenario` keywords (popped from `opts`)."""
    kw = {k: opts.pop(k) for k in PARALLEL_FLAGS}
    kw["dp_attention"] = kw.pop("enable_dp_attention")
    return kw


# every engine's knobs by name, with the engines that declare each (engines/knobs.py)
KNOBS = by_name(ENGINES.values())


def knob_options() -> list:
    """One option per engine knob, generated from its declaration: the engine's own flag
    (with the --no- form where the engine has one), its help and its default. Unset it is
    None: the scenario takes the profile's deployment value or the engine's default."""
    out = []
    for name, (k, owners) in KNOBS.items():
        text = f"{' and '.join(c.title for c in owners)}: {k.help}"
        if not k.switch:
            text += f" [default: {k.default_text}]"
        if k.kind is bool:
            out.append(click.option("/".join(k.flags), name, is_flag=True, default=None, help=text))
        else:
            out.append(click.option(*k.flags, name, type=k.kind, default=None, help=text))
    return out


SCENARIO_FLAGS = (
    "model",
    "profile",
    "engine",
    "engine_version",
    "allow_foreign_profile",
    "box",
    "nodes",
    "network",
    "kv_cache_dtype",
    "input_len",
    "output_len",
    "seed",
    *KNOBS,
    "kernel_scale",
    "allreduce_scale",
    "pcie_bandwidth_scale",
    "cpu_iteration_ms",
    "moe_distribution",
    "moe_a2a_backend",
)


def scenario_kwargs(opts: dict) -> dict:
    """The shared flags as `build_scenario` keyword arguments (unset ones left out)."""
    kw = {k: opts.pop(k) for k in SCENARIO_FLAGS}
    for name, (k, _) in KNOBS.items():
        if k.switch:  # a switch only turns a knob on; older click gives False when it is not given
            kw[name] = kw[name] or None
    return kw


LIST_FLAGS = {"engine": "--engine", "box": "--box", "input_len": "--input-len", "output_len": "--output-len"}
LIST_EXAMPLES = {
    "--engine": "sglang,vllm",
    "--box": "h100-sxm-8x,h200-sxm-8x",
    "--input-len": "256,1024",
    "--output-len": "128,512",
}


def parse_list(text: str, what: str) -> list[str]:
    """'a,b' -> ['a', 'b']: distinct, in the order given; an empty item is one line."""
    parts = [p.strip() for p in str(text).split(",")]
    require(
        all(parts),
        f"{what} '{text}' has an empty item; give comma-separated values, e.g. {what} {LIST_EXAMPLES.get(what, 'a,b')}",
    )
    return list(dict.fromkeys(parts))


def list_kwargs(kw: dict) -> dict:
    """A sweep's scenario keyword arguments with its list flags split (grid.py checks each value)."""
    return {
        k: parse_list(v, LIST_FLAGS[k]) if k in LIST_FLAGS and v is not None else v for k, v in kw.items()
    }


def parallel_grid_options(f: Callable) -> Callable:
    """The DP/EP axes that sweep and search both grid over (docs/parallel.md)."""
    f = click.option(
        "--enable-expert-parallel",
        "-ep",
        is_flag=True,
        help="every split's MoE layers expert-parallel over the GPUs they span (SGLang: ep = tp; vLLM: dp x tp)",
    )(f)
    f = click.option(
        "--enable-dp-attention",
        is_flag=True,
        help="SGLang: the dp ranks split each split's tp GPUs (DP attention)",
    )(f)
    return click.option(
        "--dp",
        "-dp",
        "--data-parallel-size",
        "dp",
        default="1",
        show_default=True,
        metavar="N[,N..]",
        help="data-parallel sizes to sweep, e.g. 1,2,4: each dp > 1 a split of pp 1 with tp = gpus / dp "
        "(tp = gpus with --enable-dp-attention)",
    )(f)


def parallel_grid_kwargs(dp: str, enable_dp_attention: bool, enable_expert_parallel: bool) -> dict:
    """The sweep's keywords for those axes (the flags off: left to the sweep's defaults)."""
    return {
        "dp": parse_ints(dp, "--dp"),
        **({"dp_attention": True} if enable_dp_attention else {}),
        **({"enable_expert_parallel": True} if enable_expert_parallel else {}),
    }

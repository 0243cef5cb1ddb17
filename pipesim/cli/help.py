"""`--help` in sections: a simulating command takes some fifty options, which read as one
flat list as nobody's; grouped, a planner finds the load, the split, the model / box /
profile, each engine's knobs (generated from their declarations, engines/knobs.py),
the what-ifs and the output where an engine's own --help would put them.

A command opts in with `cls=GroupedCommand`; each option lands in the first section
whose names hold it, the engine knobs by the engines that declare them, the rest in
"Other options".
"""

from __future__ import annotations

import click

from ..engines import ENGINES
from ..engines.knobs import by_name

LOAD = ("conc", "rate", "num_requests", "trace", "input_len", "output_len", "seed")
SPLIT = (
    "tp",
    "pp",
    "dp",
    "ep",
    "enable_dp_attention",
    "enable_expert_parallel",
    "layers",
    "gpus",
    "splits",
    "expert_parallel",
)
WHERE = (
    "model",
    "profile",
    "engine",
    "engine_version",
    "allow_foreign_profile",
    "box",
    "nodes",
    "network",
    "kv_cache_dtype",
    "moe_distribution",
    "moe_a2a_backend",
)
WHATIF = ("kernel_scale", "allreduce_scale", "pcie_bandwidth_scale", "cpu_iteration_ms")
SEARCH = (
    "objective",
    "min_per_request_tok_s",
    "max_ttft_p50_ms",
    "max_ttft_p99_ms",
    "max_tpot_p50_ms",
    "max_tpot_p99_ms",
    "across_conditions",
    "from_file",
    "simulate",
    "simulate_all",
    "running_caps",
    "chunks",
)
SECTIONS = (
    ("Load", LOAD),
    ("Split", SPLIT),
    ("Model, box and profile", WHERE),
    ("Search: objective, constraints, the plans screened", SEARCH),
    ("What-ifs (one physical cost changed)", WHATIF),
)


def knob_section(name: str) -> str | None:
    """The section of an engine knob: the engines that declare it (engines/knobs.py)."""
    knobs = by_name(ENGINES.values())
    if name not in knobs:
        return None
    owners = knobs[name][1]
    return f"Engine knobs: {' and '.join(c.title for c in owners)}"


def section_of(name: str) -> str:
    for title, names in SECTIONS:
        if name in names:
            return title
    return knob_section(name) or "Output and running"


class GroupedCommand(click.Command):
    """A click command whose --help lists its options in sections (module docstring)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            title = section_of(param.name or "")
            sections.setdefault(title, []).append(record)
        order = [t for t, _ in SECTIONS[:3]]
        order += sorted(t for t in sections if t.startswith("Engine knobs"))
        order += [t for t, _ in SECTIONS[3:]] + ["Output and running"]
        for title in order:
            if title in sections:
                with formatter.section(title):
                    formatter.write_dl(sections[title])

"""What pipesim ships: `pipesim boxes` (box presets) and `pipesim profiles` (calibration profiles)."""

from __future__ import annotations

import click


@click.group()
def boxes() -> None:
    """The box catalogue: presets, their numbers and where each comes from (docs/boxes.md)."""


JSON_HELP = "print one JSON object instead of the table"


@boxes.command("list")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def boxes_list(as_json: bool) -> None:
    """One line per preset: name, GPUs, GPU model, memory, interconnect."""
    from ..inputs.box import box_names, load_box
    from ..inputs.box_text import summary_line

    if as_json:
        from ..base.jsonout import dumps

        rows = []
        for name in box_names():
            box = load_box(name)
            rows.append(
                {
                    "name": name,
                    "gpus": box.gpu_count,
                    "gpu": box.gpu.name,
                    "memory_gib": box.gpu.memory_bytes / 2**30,
                    "interconnect": box.interconnect,
                }
            )
        click.echo(dumps({"boxes": rows}))
        return
    for name in box_names():
        click.echo(summary_line(name, load_box(name)))


@boxes.command("show")
@click.argument("name")
@click.option("--nodes", type=int, default=1, show_default=True, help="show a cluster of this many boxes")
@click.option("--network", default=None, help="what joins the nodes [default: the box's [network]]")
def boxes_show(name: str, nodes: int, network: str | None) -> None:
    """Every field of box NAME (a preset or .toml) with its source, the topology tree, and
    where a run on it without --profile takes its kernel and collective costs from."""
    from ..engines import ENGINES
    from ..inputs.box import load_box
    from ..inputs.box_text import details
    from ..profiles.catalogue import table_source

    box = load_box(name, nodes, network)
    click.echo("\n".join(details(box)))
    click.echo("costs without --profile (docs/boxes.md, Profiles for a box)")
    for engine in ENGINES:
        click.echo(f"  {engine:<8}{table_source(load_box(name), engine)}")


@click.group()
def profiles() -> None:
    """List and inspect calibration profiles."""


@profiles.command("list")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def profiles_list(as_json: bool) -> None:
    """The shipped profiles."""
    from ..profiles.profile import load_profile, profile_names

    if as_json:
        from ..base.jsonout import dumps

        rows = []
        for name in profile_names():
            p = load_profile(name)
            rows.append({"name": name, "engine": p.engine, "engine_version": p.engine_version, "box": p.box})
        click.echo(dumps({"profiles": rows}))
        return
    for name in profile_names():
        p = load_profile(name)
        click.echo(f"{name:40s} {p.engine} {p.engine_version:8s} box {p.box}")


@profiles.command("show")
@click.argument("name")
def profiles_show(name: str) -> None:
    """One profile: its box, engine, parameters and the source of every table."""
    from ..profiles.profile import load_profile, profile_folder

    p = load_profile(name)
    click.echo(f"{p.name}: {p.meta.get('description', '')}")
    click.echo(f"  folder {profile_folder(name)}")
    click.echo(f"  box {p.box}, engine {p.engine} {p.engine_version}")
    click.echo("  parameters:")
    for k, v in vars(p.params).items():
        src = p.meta.get("param_sources", {}).get(k, "")
        click.echo(f"    {k:28s} {v!s:>12}   {src}")
    click.echo("  tables:")
    for t, df in p.tables.items():
        click.echo(f"    {t:14s} {len(df):>7,} rows   {p.sources.get(t, '')}")
    if p.deployment:
        click.echo("  deployment flags: " + ", ".join(f"{k}={v}" for k, v in p.deployment.items()))

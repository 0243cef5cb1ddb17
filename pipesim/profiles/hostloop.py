"""The host loop's defaults per engine and version (pipesim/data/host_loop.toml), read
into a profile's parameters where the profile does not set them.

A profile measured or fitted its own costs; everything else about the engine's CPU side
(its scheduler, input preparation, output path, launches, CPU-group broadcast) is the
engine's, so it comes with the engine and the release that runs: the block of
host_loop.toml whose `from` is the newest at or below the version. Every default carries
its source into the profile's `param_sources`, so a prediction says where each came from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from ..base.checks import parse_toml
from ..base.errors import require
from .importers.aiconfigurator_layout import version_key
from .profile import HOST_PARAMS

if TYPE_CHECKING:
    from .profile import Profile

DATA = "host_loop.toml"


@cache
def _data() -> dict:
    text = resources.files("pipesim.data").joinpath(DATA).read_text(encoding="utf-8")
    return parse_toml(text, f"pipesim/data/{DATA}")


@dataclass(frozen=True)
class Era:
    """The defaults of one engine from one release on: `label` says what its host loop is."""

    engine: str
    first: str  # the release these defaults start at
    label: str
    params: dict  # HOST_PARAMS name -> value
    sources: dict  # name -> where the value comes from


def modelled(engine: str) -> tuple[str, str, tuple[str, ...]]:
    """(first release, last minor series, releases whose source was read) of an engine."""
    v = _data()["versions"][engine]
    return v["first"], v["last"], tuple(v["read"])


def newest(engine: str) -> str:
    """The newest release of an engine whose source was read: the default version."""
    return max(modelled(engine)[2], key=version_key)


def check_version(engine: str, version: str) -> str:
    """`version` when pipesim models it for `engine` (from its first release through its
    last minor series), else one UserError line listing what it models."""
    first, last, read = modelled(engine)
    key = version_key(version) if isinstance(version, str) else ()
    ok = len(key) >= 2 and key >= version_key(first) and key[:2] <= version_key(last)[:2]
    require(
        ok,
        f"--engine-version {version!r}: pipesim models {engine} {first} to {last}.x "
        f"({'; '.join(era.label + ' from ' + era.first for era in eras(engine))}); "
        f"its source was read at {', '.join(read)}",
    )
    return version


@cache
def eras(engine: str) -> tuple[Era, ...]:
    """An engine's blocks of defaults, oldest first, each completed by [common]."""
    data = _data()
    common, common_src = dict(data["common"]), dict(data["common"].get("sources", {}))
    common.pop("sources", None)
    out = []
    for block in sorted(data[engine], key=lambda b: version_key(b["from"])):
        params = {**common, **block["params"]}
        sources = {**common_src, **block["sources"]}
        missing = sorted(set(HOST_PARAMS) - set(params)) + sorted(set(params) - set(sources))
        require(not missing, f"pipesim/data/{DATA}: {engine} {block['from']} lacks {', '.join(missing)}")
        out.append(Era(engine, block["from"], block["label"], params, sources))
    return tuple(out)


def era(engine: str, version: str) -> Era:
    """The defaults that hold for `version` (checked: `check_version`)."""
    key = version_key(check_version(engine, version))
    return [e for e in eras(engine) if version_key(e.first) <= key][-1]


def kernels() -> dict[str, float]:
    """Kernels a decoder layer's blocks launch without a CUDA graph (docs/host-loop.md §4.2)."""
    return {k: float(v) for k, v in _data()["kernels"].items() if k != "sources"}


def kernel_sources() -> dict[str, str]:
    return dict(_data()["kernels"]["sources"])


def with_host_defaults(profile: Profile, engine: str, version: str) -> Profile:
    """`profile` with every host-loop parameter it does not set taken from the defaults of
    `engine` at `version`, each default's source in `param_sources` and the block used
    in `meta["host_loop"]`. A profile measured with another engine keeps none of its own
    host-loop values: they were another engine's."""
    e = era(engine, version)
    own = profile.meta.get("params", {}) if profile.engine == engine else {}
    values = {k: v for k, v in e.params.items() if k not in own}
    sources = dict(profile.meta.get("param_sources", {}))
    for k in values:
        sources[k] = f"host-loop default, {engine} {e.first}+ ({e.label}): {e.sources[k]}"
    meta = {
        **profile.meta,
        "param_sources": sources,
        "host_loop": {"engine": engine, "version": version, "from": e.first, "label": e.label},
    }
    return replace(profile, params=replace(profile.params, **values), meta=meta)


def markdown() -> str:
    """The defaults table of docs/engines.md §10: per parameter, each engine's releases that
    share a value and source, the value and its source (the [common] ones once)."""
    rows = ["| parameter | engine, releases | default | source |", "|---|---|---|---|"]
    data = _data()
    common = {k for k in data["common"] if k != "sources"}
    for name in HOST_PARAMS:
        if name in common and all(name not in b["params"] for e in ("sglang", "vllm") for b in data[e]):
            rows.append(f"| `{name}` | all | {data['common'][name]:g} | {data['common']['sources'][name]} |")
            continue
        for engine in ("vllm", "sglang"):
            runs: list[list] = []  # [first, last, value, source]
            for era in eras(engine):
                v, src = era.params[name], era.sources[name]
                if runs and runs[-1][2:] == [v, src]:
                    runs[-1][1] = era.first
                else:
                    runs.append([era.first, era.first, v, src])
            starts = [e.first for e in eras(engine)] + [None]
            for first, last, v, src in runs:
                after = starts[starts.index(last) + 1]
                span = f"{first} on" if after is None else f"{first} to before {after}"
                rows.append(f"| `{name}` | {engine} {span} | {v:g} | {src} |")
    for k, v in kernels().items():
        rows.append(f"| kernels: {k.replace('_', ' ')} | all | {v:g} | {kernel_sources()[k]} |")
    return "\n".join(rows)

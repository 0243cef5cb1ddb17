"""Engine knobs, each declared once: on its config field.

`knob(...)` makes a config field a knob: the engine's own flag, what it sets, the
values pipesim accepts and where the engine defines it. Everything else is read from
the declarations (`knobs`), so nothing can drift: the command line's options
(cli/options.py), the keywords `build_scenario` takes and the message that lists them,
the check of a value given or taken from a profile's deployment (`check_values`), and
the knob table of docs/engines.md (`markdown`). A field's default is the engine's: a
constant, or None where the engine derives the value (the config's `resolve` applies
the rule; `default_text` says it in words).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from functools import cache
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

from ..base.checks import flag, is_number, whole
from ..base.errors import require

if TYPE_CHECKING:
    from .protocol import EngineConfig

KEY = "pipesim.knob"  # the metadata key of a declaration


@dataclass(frozen=True)
class Knob:
    """One declared knob: `name` is the config field and build_scenario's keyword."""

    name: str
    kind: type  # int, float or bool
    default: object  # the field's default; None: the engine derives it (`default_text`)
    flags: tuple[str, ...]  # the engine's flag; a negatable boolean's --no- flag second
    help: str
    default_text: str
    source: str  # where the engine defines the flag and its default
    bounds: tuple[float, float] | None  # whole numbers in [lo, hi]; numbers in (lo, hi)

    @property
    def switch(self) -> bool:
        """A boolean that can only be turned on (argparse store_true, e.g. SGLang's)."""
        return self.kind is bool and len(self.flags) == 1


def knob(
    default: object,
    *,
    help: str,
    source: str,
    default_text: str | None = None,
    bounds: tuple[float, float] | None = None,
    negatable: bool = False,
    flag: str | None = None,
) -> Any:
    """A config field declared as an engine knob. `flag`: the engine's flag when it is
    not the field's name in dashes. `negatable`: the engine also takes `--no-<flag>`
    (vLLM's booleans: argparse's BooleanOptionalAction); a boolean without it is a
    switch that only turns it on (SGLang's store_true). `default_text`: what a None
    default resolves to, in words (required then)."""
    if default is None and not default_text:
        raise TypeError("a knob whose default is None says what the engine derives (default_text)")
    meta = dict(
        help=help, source=source, default_text=default_text, bounds=bounds, negatable=negatable, flag=flag
    )
    return field(default=default, metadata={KEY: meta})


def _kind(hint: object) -> type:
    """int, float or bool from a field's type (`int | None` -> int)."""
    if get_origin(hint) in (Union, UnionType):
        (hint,) = (a for a in get_args(hint) if a is not NoneType)
    if hint not in (int, float, bool):
        raise TypeError(f"an engine knob is an int, a float or a bool, not {hint}")
    return hint


def _text(value: object) -> str:
    """A constant default as help texts show it: on / off, 16384, 0.9."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}"


@cache
def knobs(config: type) -> tuple[Knob, ...]:
    """Every knob of an engine's config class, in field order. A field declared without
    `knob()` is refused: no knob joins an engine undeclared."""
    hints = get_type_hints(config)
    out = []
    for f in fields(config):
        if KEY not in f.metadata:
            raise TypeError(f"{config.__name__}.{f.name} is not declared with engines.knobs.knob()")
        m = f.metadata[KEY]
        kind = _kind(hints[f.name])
        if kind is not bool and m["bounds"] is None:
            raise TypeError(f"{config.__name__}.{f.name}: a number knob declares its bounds")
        main = m["flag"] or "--" + f.name.replace("_", "-")
        flags = (main, "--no-" + main[2:]) if m["negatable"] else (main,)
        text = m["default_text"] or _text(f.default)
        out.append(Knob(f.name, kind, f.default, flags, m["help"], text, m["source"], m["bounds"]))
    return tuple(out)


def knob_names(config: type) -> tuple[str, ...]:
    """The knobs `build_scenario` takes for this engine, sorted (the order of its message)."""
    return tuple(sorted(k.name for k in knobs(config)))


def check_values(config: type, values: dict) -> dict:
    """Values of this engine's knobs (given, or a profile's deployment flags), each
    within its declaration: whole numbers in [lo, hi], numbers in (lo, hi), booleans.
    Returns them as Python values (a numpy integer becomes an int); None is left as is."""
    declared = {k.name: k for k in knobs(config)}
    out = dict(values)
    for name, v in values.items():
        k = declared[name]
        if v is None:
            continue
        if k.kind is bool:
            out[name] = flag(v, k.flags[0])
        elif k.kind is int:
            assert k.bounds is not None  # knobs(): every number knob declares its bounds
            lo, hi = k.bounds
            out[name] = whole(v, k.flags[0], int(lo), int(hi))
        else:
            assert k.bounds is not None
            lo, hi = k.bounds
            require(
                is_number(v) and lo < float(v) < hi,
                f"{k.flags[0]} must be a number in ({lo:g}, {hi:g}), got {v!r}",
            )
            out[name] = float(v)
    return out


def by_name(
    configs: Iterable[type[EngineConfig]],
) -> dict[str, tuple[Knob, tuple[type[EngineConfig], ...]]]:
    """Every engine's knobs by name, with the configs that declare each; one name in
    two engines must be one flag of one kind (it becomes one command-line option)."""
    out: dict[str, tuple[Knob, tuple[type[EngineConfig], ...]]] = {}
    for config in configs:
        for k in knobs(config):
            if k.name in out:
                first, owners = out[k.name]
                if (first.flags, first.kind) != (k.flags, k.kind):
                    raise TypeError(
                        f"knob {k.name}: {owners[0].__name__} and {config.__name__} declare it apart"
                    )
                out[k.name] = (first, (*owners, config))
            else:
                out[k.name] = (k, (config,))
    return out


def markdown(configs: Iterable[type[EngineConfig]]) -> str:
    """The knob table of docs/engines.md, one row per engine knob."""
    rows = [
        "| engine | flag | keyword | default | what it sets | engine source |",
        "|---|---|---|---|---|---|",
    ]
    for config in configs:
        for k in knobs(config):
            flags = " / ".join(f"`{f}`" for f in k.flags) + (
                "" if k.kind is bool else f" {k.kind.__name__.upper()}"
            )
            rows.append(
                f"| {config.name} | {flags} | `{k.name}` | {k.default_text} | {k.help} | {k.source} |"
            )
    return "\n".join(rows)

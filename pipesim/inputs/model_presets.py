"""The model presets (pipesim/data/models) and the Hugging Face ids they stand for.

A preset is the public config.json of one Hugging Face repository, cut to the fields
pipesim reads; its `_hf_id` names that repository, so `--model
meta-llama/Llama-3.1-70B-Instruct` (the id an engine is launched with) is the preset
`llama-3.1-70b`. Ids are matched as Hugging Face matches them, without regard to case.
pipesim downloads nothing: an id no preset stands for is refused with how to give its
config instead. Kimi K2.x has no id: its preset is the text backbone K2, K2.5 and K2.6
share, not one repository's file.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

# owner/name, as Hugging Face spells a repository id (no path separators beyond the one)
HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def preset_names() -> list[str]:
    folder = resources.files("pipesim.data").joinpath("models")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def preset_text(name: str) -> str:
    return resources.files("pipesim.data").joinpath("models").joinpath(f"{name}.json").read_text()


@cache
def preset_ids() -> dict[str, str]:
    """Hugging Face id (lower case) -> preset name, for every preset that names one."""
    out = {}
    for name in preset_names():
        hf_id = json.loads(preset_text(name)).get("_hf_id")
        if isinstance(hf_id, str) and hf_id:
            out[hf_id.lower()] = name
    return out


def preset_for(text: str) -> str | None:
    """The preset `text` names: a preset's own name, or the Hugging Face id it stands
    for (any case); None if neither."""
    if text in preset_names():
        return text
    return preset_ids().get(text.strip().lower())


def looks_like_hf_id(text: str) -> bool:
    """'owner/name' with no file suffix: what a user means as a Hugging Face id."""
    return bool(HF_ID.match(text)) and not text.endswith(".json")


def hf_id(name: str) -> str | None:
    """The Hugging Face id a preset stands for (None: Kimi K2.x's shared backbone)."""
    value = json.loads(preset_text(name)).get("_hf_id")
    return value if isinstance(value, str) and value else None

"""Hugging Face ids resolved to presets (inputs/model_presets.py): each preset's
`_hf_id` is the repository its `_source` names, the id loads the preset in any case,
and an id no preset stands for is one clear line, never a download."""

import json
from importlib import resources

import pytest

from pipesim.base.errors import UserError
from pipesim.inputs.model import load_model, read_hf_config
from pipesim.inputs.model_presets import hf_id, looks_like_hf_id, preset_for, preset_ids, preset_names

# presets that stand for no single repository (model_presets.py's docstring says why)
NO_ID = {"kimi-k2.6"}


def _raw(name: str) -> dict:
    return json.loads(resources.files("pipesim.data").joinpath("models", f"{name}.json").read_text())


@pytest.mark.parametrize("name", preset_names())
def test_each_presets_id_is_the_repository_its_source_names(name):
    raw = _raw(name)
    if name in NO_ID:
        assert hf_id(name) is None
        return
    source_repo = raw["_source"].split()[0]
    assert looks_like_hf_id(source_repo), raw["_source"]
    assert hf_id(name) == source_repo
    # the id, as an engine is launched with it, in any case, names this preset
    assert preset_for(source_repo) == name
    assert preset_for(source_repo.upper()) == name
    cfg, shown = read_hf_config(source_repo)
    assert shown == name and cfg["num_hidden_layers"] == raw["num_hidden_layers"]


def test_ids_are_unique_and_every_preset_but_the_shared_backbone_has_one():
    assert len(preset_ids()) == len(preset_names()) - len(NO_ID)
    assert (
        load_model("meta-llama/Llama-3.1-70B-Instruct").num_layers == load_model("llama-3.1-70b").num_layers
    )


def test_an_id_no_preset_stands_for_is_refused_with_how_to_give_it():
    with pytest.raises(UserError, match="no preset stands for this Hugging Face id.*downloads nothing"):
        load_model("someone/Some-Model-7B")


def test_a_downloaded_folder_is_read_not_the_preset(tmp_path):
    """A local folder named like an id is the user's own config (which may differ)."""
    folder = tmp_path / "meta-llama" / "Llama-3.1-8B-Instruct"
    folder.mkdir(parents=True)
    cfg = _raw("llama-3.1-8b")
    cfg["num_hidden_layers"] = 8
    (folder / "config.json").write_text(json.dumps(cfg))
    loaded, name = read_hf_config(folder)
    assert loaded["num_hidden_layers"] == 8
    assert name == "meta-llama/Llama-3.1-8B-Instruct"  # its _hf_id, not the folder's last part


def test_a_config_path_is_named_by_the_repository_it_records(tmp_path):
    cfg = {k: v for k, v in _raw("qwen3-8b").items() if not k.startswith("_")}
    (tmp_path / "to").mkdir()
    path = tmp_path / "to" / "config.json"
    path.write_text(json.dumps({**cfg, "_name_or_path": "acme/tuned-qwen"}))
    assert read_hf_config(path)[1] == "acme/tuned-qwen"
    path.write_text(json.dumps(cfg))
    assert read_hf_config(path)[1] == str(path)  # not 'to'

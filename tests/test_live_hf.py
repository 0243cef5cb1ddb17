"""Live calibration, the Hugging Face transformers harness on the CPU."""

import importlib.util

import pytest

from pipesim.base.errors import UserError
from pipesim.calibrate.live import hf


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_torch = pytest.mark.skipif(not has("torch"), reason="torch is not installed (pipesim[live])")
needs_transformers = pytest.mark.skipif(
    not (has("torch") and has("transformers")), reason="needs pipesim[live]"
)


@needs_transformers
def test_hf_model_from_config_and_decode_step(tmp_path):
    import torch

    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 3,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "eos_token_id": 2,
        "_source": "ignored",
    }
    model = hf.build_hf_model(cfg, torch.device("cpu"), layers=1)
    assert model.config.num_hidden_layers == 1 and next(model.parameters()).dtype == torch.bfloat16
    assert hf.generate_once_s(model, 2, 5, 4) > 0  # exactly 4 tokens, or it raises
    wall, kern = hf.hf_step(model, 1, 5, short=1, long=3, repeats=1, with_kernels=False)
    assert wall > 0 and kern is None
    with pytest.raises(UserError, match="model_type"):
        hf.build_hf_model({"num_hidden_layers": 1}, torch.device("cpu"))

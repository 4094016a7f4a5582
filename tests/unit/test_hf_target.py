"""eyas.hf_target: a target folder flat or in a multimodal wrapper's layout (Kimi-K2.5's:
architectures of the wrapper, the text model under text_config, weights named
language_model.*), read and loaded the same way. The Kimi replica itself is checked in
tests/unit/tiny/test_kimi_replica_build.py."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from support.extract_fixtures import llama8  # noqa: F401
from transformers import AutoModelForCausalLM

from eyas.errors import ConfigError, DataError
from eyas.extract.target import load_target_lm_head, target_shape
from eyas.hf_target import (
    architecture,
    ensure_serving_folder,
    load_causal_lm,
    serving_folder,
    text_config,
)
from eyas.remote.probe import hidden_size_from_config
from eyas.train.model import DrafterConfig

WRAPPER = "KimiK25ForConditionalGeneration"


def _wrap(flat: Path, out: Path, *, prefix: str = "language_model.", model_type=None) -> Path:
    """`flat` copied to `out` in a wrapper's layout (config nested, weights prefixed)."""
    shutil.copytree(flat, out)
    config = json.loads((out / "config.json").read_text())
    if model_type:
        config["model_type"] = model_type
    (out / "config.json").write_text(json.dumps({
        "architectures": [WRAPPER], "model_type": "kimi_k25", "text_config": config,
        "vision_config": {"hidden_size": 8}}))
    with safe_open(str(out / "model.safetensors"), framework="pt") as fh:
        tensors = {prefix + k: fh.get_tensor(k) for k in fh.keys()}
    tensors["vision_tower.patch_embed.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_text_config_and_architecture_of_flat_and_wrapped_configs():
    flat = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "vocab_size": 300, "rms_norm_eps": 1e-6}
    assert text_config(flat) is flat and architecture(flat) == "LlamaForCausalLM"
    wrapped = {"architectures": [WRAPPER], "tie_word_embeddings": False,
               "text_config": {**flat, "tie_word_embeddings": True}}
    assert text_config(wrapped)["hidden_size"] == 64
    assert text_config(wrapped)["tie_word_embeddings"] is False  # the outer value wins
    assert architecture(wrapped) == WRAPPER
    assert DrafterConfig.from_target(wrapped, 16).hidden_size == 64


def test_wrapper_folder_loads_its_text_model_and_serves_a_flat_view(llama8, tmp_path,  # noqa: F811
                                                                     monkeypatch):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path / "cache"))
    folder = _wrap(llama8, tmp_path / "wrapped")
    shape = target_shape(folder)
    assert (shape.num_layers, shape.hidden_size, shape.architecture) == (8, 64, WRAPPER)
    with pytest.raises((ValueError, KeyError, OSError)):
        AutoModelForCausalLM.from_pretrained(folder)  # transformers has no wrapper class
    ref = AutoModelForCausalLM.from_pretrained(llama8, dtype=torch.float32)
    model = load_causal_lm(folder, dtype=torch.float32)
    ids = torch.tensor([[3, 14, 15, 92]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=0)
    assert torch.equal(load_target_lm_head(folder), ref.lm_head.weight)
    cfg = types.SimpleNamespace(target=types.SimpleNamespace(model=str(folder)),
                                resolve_path=Path)
    assert hidden_size_from_config(cfg) == 64

    view = ensure_serving_folder(folder)
    assert view == serving_folder(folder) and view.parent.parent == tmp_path / "cache"
    assert serving_folder(llama8) == llama8.resolve()  # a flat folder is served as it is
    with safe_open(str(view / "model.safetensors"), framework="pt") as fh:
        assert not any(k.startswith(("language_model.", "vision_tower.")) for k in fh.keys())
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(view)(ids).logits,
                                   ref(ids).logits, rtol=0, atol=0)


def test_wrapper_errors_name_the_field_or_the_weights(llama8, tmp_path):  # noqa: F811
    odd = _wrap(llama8, tmp_path / "odd", model_type="not_a_model")
    with pytest.raises(ConfigError, match=r"text_config.model_type 'not_a_model'"):
        load_causal_lm(odd)
    unprefixed = _wrap(llama8, tmp_path / "plain", prefix="")
    with pytest.raises(DataError, match=r"no weight is named language_model\.\*"):
        load_causal_lm(unprefixed)

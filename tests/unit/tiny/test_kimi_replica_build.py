"""The Kimi replica target: built offline once, cached, rebuilt when partial."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyas.extract.target import load_target_embeddings, load_target_lm_head, target_shape
from eyas.hf_target import ensure_serving_folder, load_causal_lm, serving_folder
from eyas.serve import served_model_name
from eyas.tiny.kimi_replica import BUILD_INFO, build_kimi_replica, is_complete

pytestmark = [pytest.mark.slow]


def test_replica_is_kimis_kind_cached_and_a_partial_folder_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    folder = build_kimi_replica()
    assert folder == tmp_path / "kimi-replica-v2" and is_complete(folder)
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert config["model_type"] == "kimi_k25" and "vision_config" in config
    assert text["model_type"] == "kimi_k2" and text["kv_lora_rank"]
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert type(tok).__name__ == "KimiLikeTokenizer" and len(tok) == text["vocab_size"] == 4096
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]
    shape = target_shape(folder)
    assert (shape.num_layers, shape.hidden_size, shape.vocab_size, shape.architecture) == (
        7, 64, 4096, "KimiK25ForConditionalGeneration")
    weights = (folder / "model.safetensors").read_bytes()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert build_kimi_replica() == folder  # cached: nothing rebuilt
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp

    os.remove(folder / BUILD_INFO)  # an interrupted build leaves no record: rebuilt
    assert not is_complete(folder)
    again = build_kimi_replica()
    assert is_complete(again)
    assert (again / "model.safetensors").read_bytes() == weights  # seeded: the same model
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_replica_weights_are_named_as_kimis_and_eyas_loads_the_text_model(tmp_path,
                                                                          monkeypatch):
    """Kimi-K2.5's checkpoint names: language_model.model.layers.*, ...embed_tokens, ...lm_head.
    transformers cannot load the wrapper; eyas builds the DeepSeek-V3 text model from
    text_config and loads those weights (every one of them, none left at its initial value),
    and serves a flat view of it whose model equals it."""
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    folder = build_kimi_replica()
    with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
        names = list(fh.keys())
        embed = fh.get_tensor("language_model.model.embed_tokens.weight")
        head = fh.get_tensor("language_model.lm_head.weight")
        expert = fh.get_tensor("language_model.model.layers.1.mlp.experts.0.down_proj.weight")
    assert all(n.startswith("language_model.") for n in names)
    assert any(n.startswith("language_model.model.layers.6.") for n in names)
    with pytest.raises((ValueError, KeyError, OSError)):
        AutoModelForCausalLM.from_pretrained(folder)  # no transformers class for the wrapper
    model = load_causal_lm(folder, dtype=torch.float32)
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    assert model.config.num_hidden_layers == 7
    assert torch.equal(model.get_input_embeddings().weight, embed)
    assert torch.equal(model.lm_head.weight, head)
    assert torch.equal(load_target_embeddings(folder), embed)
    assert torch.equal(load_target_lm_head(folder), head)
    experts = model.model.layers[1].mlp.experts
    assert torch.equal(experts.down_proj[0], expert)  # fused by transformers, same values

    view = ensure_serving_folder(folder)
    assert view == serving_folder(folder) != folder and str(view) == served_model_name(folder)
    assert json.loads((view / "config.json").read_text())["model_type"] == "deepseek_v3"
    flat = AutoModelForCausalLM.from_pretrained(view)
    ids = torch.tensor([[5, 17, 300, 42]])
    with torch.no_grad():
        torch.testing.assert_close(flat(ids).logits, model(ids).logits)
    assert ensure_serving_folder(folder) == view  # made once

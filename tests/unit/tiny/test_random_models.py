"""Tiny random models of each supported architecture load and run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.tiny_fixtures import shared_tokenizer_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyas.errors import ConfigError
from eyas.tiny.random_models import ARCHES, build_random_model


@pytest.fixture(scope="module")
def tok_dir() -> Path:
    return shared_tokenizer_dir()


@pytest.mark.parametrize("arch", ARCHES)
def test_random_model_loads_and_runs(arch, tok_dir, tmp_path):
    folder = build_random_model(arch, tmp_path / arch, tokenizer_dir=tok_dir, seed=3)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == arch
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    ids_BT = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = model(input_ids=ids_BT, output_hidden_states=True)
    assert out.logits.shape == (1, ids_BT.shape[1], len(tokenizer))
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert torch.isfinite(out.logits).all()
    assert not any(p.name.startswith(".tmp-") for p in folder.iterdir())


def test_same_seed_same_weights_other_seed_differs(tok_dir, tmp_path):
    a = build_random_model("llama", tmp_path / "a", tokenizer_dir=tok_dir, seed=1)
    b = build_random_model("llama", tmp_path / "b", tokenizer_dir=tok_dir, seed=1)
    c = build_random_model("llama", tmp_path / "c", tokenizer_dir=tok_dir, seed=2)
    wa = (a / "model.safetensors").read_bytes()
    assert wa == (b / "model.safetensors").read_bytes()
    assert wa != (c / "model.safetensors").read_bytes()


def test_moe_has_experts(tok_dir, tmp_path):
    folder = build_random_model("qwen3_moe", tmp_path / "moe", tokenizer_dir=tok_dir)
    config = AutoModelForCausalLM.from_pretrained(folder).config
    assert config.num_experts == 4 and config.num_experts_per_tok == 2


def test_unknown_arch_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown architecture 'gpt9'"):
        build_random_model("gpt9", tmp_path)


def test_builds_its_own_tokenizer_when_none_given(tmp_path):
    folder = build_random_model("llama", tmp_path / "m")
    assert AutoTokenizer.from_pretrained(folder).eos_token == "<|end|>"


def test_deepseek_v3_has_mla_and_moe_and_takes_a_remote_code_tokenizer(tmp_path):
    from support.loss_mask_fixtures import build_kimi_test_tokenizer

    kimi_tok = build_kimi_test_tokenizer(tmp_path / "tok")
    folder = build_random_model("deepseek_v3", tmp_path / "ds", tokenizer_dir=kimi_tok, seed=0)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert config["kv_lora_rank"] and config["q_lora_rank"] and config["v_head_dim"]
    assert config["n_routed_experts"] == 4 and config["first_k_dense_replace"] == 1
    assert config["num_hidden_layers"] == 7
    # The tokenizer travels as files, its class included, and needs trust_remote_code.
    for name in ("tiktoken.model", "tokenization_kimi_like.py", "chat_template.jinja"):
        assert (folder / name).read_bytes() == (kimi_tok / name).read_bytes()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == len(tokenizer)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "你好"}], tokenize=True,
                                        return_dict=False)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    assert len(out.hidden_states) == 8 and torch.isfinite(out.logits).all()

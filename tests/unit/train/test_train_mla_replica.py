"""The MLA drafter on the Kimi replica (a DeepSeek-V3 with MLA in Kimi-K2.5's wrapper): training
with ``drafter: mla`` (EAGLE-3.1's options, attention started from the target's last layer)
exports a folder the SGLang loader mirror takes whole, and the offline evaluator runs it."""

from __future__ import annotations

import json

import pytest
import torch
from support.replica_records import replica_records
from support.sglang_mla_mirror import check_taken_whole

from eyas.train.tiny_data import write_jsonl

pytestmark = [pytest.mark.slow]


def test_mla_drafter_trains_on_the_kimi_replica_exports_whole_and_evaluates(tmp_path):
    from eyas.evaluate.config import EvaluateConfig
    from eyas.evaluate.run import evaluate, select_prompts
    from eyas.extract.config import ExtractConfig
    from eyas.extract.run import extract
    from eyas.tiny import build_kimi_replica
    from eyas.train.export import load_exported
    from eyas.train.run import main

    torch.set_num_threads(1)
    replica = build_kimi_replica()
    train = write_jsonl(tmp_path / "merged" / "train.jsonl", replica_records(8, 0, "train"))
    evals = write_jsonl(tmp_path / "merged" / "eval.jsonl", replica_records(3, 1, "eval"))
    shards = {}
    for name, jsonl in (("train", train), ("eval", evals)):
        shards[name] = tmp_path / "hidden" / name
        extract(jsonl, shards[name], model_dir=replica, trust_remote_code=True,
                cfg=ExtractConfig(storage="final", shard_size=8, device="cpu"))
    out = tmp_path / "drafter"
    assert main(["--shards", str(shards["train"]), "--eval-shards", str(shards["eval"]),
                 "--model", str(replica), "--out", str(out), "--steps", "6", "--eval-every", "3",
                 "--ttt-steps", "3", "--micro-batch", "4", "--lr", "2e-3", "--warmup-steps", "1",
                 "--draft-vocab-size", "1024", "--device", "cpu", "--drafter", "mla",
                 "--fc-norm", "--norm-output", "--mla-init-attention", "target"]) == 0
    export = out / "export"
    config = check_taken_whole(export)
    text = json.loads((replica / "config.json").read_text())["text_config"]
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "num_attention_heads"):
        assert config[key] == text[key], key
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["fc_norm"] and config["norm_output"]
    assert json.loads((out / "best" / "drafter.json").read_text())["attention"] == "mla"

    from eyas.extract.target import load_target_embeddings

    drafter, _, layers = load_exported(export, load_target_embeddings(replica))
    assert drafter.cfg.attention == "mla" and layers == [1, 2, 3]

    cfg = EvaluateConfig(device="cpu", threads=1, max_new_tokens=8, prompts_per_dataset=2,
                         baselines=["untrained"])
    selection = select_prompts(cfg, eval_jsonl=evals, train_jsonl=train, prompt_files=[],
                               tokenizer=None)
    report = evaluate(replica, export, selection, cfg, tmp_path / "evaluate",
                      trust_remote_code=True, on_log=None)
    assert report["acceptance_length"] >= 1.0  # the MLA drafter drafted through the evaluator
    # training's simulated τ came from the same drafter kind (the manifest's best evaluation)
    assert json.loads((export / "manifest.json").read_text())["counts"]["metrics"]["acc"]

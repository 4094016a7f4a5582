"""`eyas train` with ``train.drafter: mla`` on recipes/kimi-replica.yaml (Kimi-K2.5's kind of
target at toy size): the export is taken whole by the mirror of SGLang's
Eagle3DeepseekV2ForCausalLM loader, and the offline evaluator runs it."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from support.paths import REPO
from support.replica_records import replica_records
from support.sglang_mla_mirror import check_taken_whole

from eyas.train.tiny_data import write_jsonl

pytestmark = [pytest.mark.slow]


def test_eyas_train_with_the_mla_drafter_on_the_kimi_replica_recipe(tmp_path, prefect_client,
                                                                     capsys):
    from eyas.cli import main
    from eyas.config import load_config
    from eyas.evaluate.config import EvaluateConfig
    from eyas.evaluate.run import evaluate, select_prompts
    from eyas.extract.config import ExtractConfig
    from eyas.extract.run import extract
    from eyas.tiny import build_kimi_replica

    torch.set_num_threads(1)
    raw = yaml.safe_load((REPO / "recipes" / "kimi-replica.yaml").read_text())
    raw["train"].update(drafter="mla", fc_norm=True, norm_output=True, mla={"init_attention": "target"},
                        steps=4, eval_every=2, checkpoint_every=2, ttt_steps=3)
    cfg_path = tmp_path / "kimi-replica-mla.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cfg = load_config(cfg_path)
    assert cfg.train.drafter == "mla"
    replica = build_kimi_replica()
    workdir = tmp_path / "run"
    for split, n, seed in (("train", 8, 0), ("eval", 3, 1)):
        jsonl = write_jsonl(workdir / "merged" / f"{split}.jsonl", replica_records(n, seed, split))
        extract(jsonl, workdir / "hidden" / split, model_dir=replica, trust_remote_code=True,
                cfg=ExtractConfig(storage="final", shard_size=8, device="cpu"))
    capsys.readouterr()
    assert main(["train", "--config", str(cfg_path), "--workdir", str(workdir)]) == 0
    assert "exported drafter: " in capsys.readouterr().out
    export = workdir / "drafter" / "export"
    config = check_taken_whole(export)
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert config["kv_lora_rank"] == json.loads((replica / "config.json").read_text())[
        "text_config"]["kv_lora_rank"]
    ecfg = EvaluateConfig(device="cpu", threads=1, max_new_tokens=8, baselines=[])
    selection = select_prompts(ecfg, eval_jsonl=workdir / "merged" / "eval.jsonl",
                               train_jsonl=None, prompt_files=[], tokenizer=None)
    report = evaluate(replica, export, selection, ecfg, tmp_path / "evaluate",
                      trust_remote_code=True, on_log=None)
    assert report["acceptance_length"] >= 1.0

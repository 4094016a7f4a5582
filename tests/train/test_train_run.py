"""`python -m eyas.train.run` end to end on the tiny target: shards in, SGLang folder out."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from eyas.train.export import load_exported
from eyas.train.run import main
from eyas.train.tiny_data import extract_shards, tiny_records, write_jsonl


@pytest.mark.slow
def test_run_trains_exports_and_resumes(tiny_target, tmp_path, capsys):
    torch.set_num_threads(1)
    train = write_jsonl(tmp_path / "merged" / "train.jsonl", tiny_records(tiny_target, 8))
    evals = write_jsonl(tmp_path / "merged" / "eval.jsonl", tiny_records(tiny_target, 4, heldout=True))
    shards = extract_shards(tiny_target, train, tmp_path / "hidden" / "train", storage="final")
    eval_shards = extract_shards(tiny_target, evals, tmp_path / "hidden" / "eval", storage="final")
    out = tmp_path / "drafter"
    args = ["--shards", str(shards), "--eval-shards", str(eval_shards), "--model", str(tiny_target),
            "--out", str(out), "--steps", "4", "--eval-every", "2", "--ttt-steps", "3",
            "--max-len", "96", "--micro-batch", "2", "--log-every", "1", "--device", "cpu"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.strip().splitlines()[-1])
    assert "eval @    4" in printed and "exported SGLang EAGLE3 drafter" in printed
    export = out / "export"
    config = json.loads((export / "config.json").read_text())
    manifest = json.loads((shards / "shard-00000" / "manifest.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == manifest["shard"]["aux_layers"]
    assert config["vocab_size"] == json.loads((tiny_target / "config.json").read_text())["vocab_size"]
    tensors = load_file(str(export / "model.safetensors"))
    assert tensors["t2d"].sum() == config["draft_vocab_size"] == summary["draft_vocab_size"]
    from eyas.extract.target import load_target_embeddings

    drafter, vocab, _ = load_exported(export, load_target_embeddings(tiny_target))
    best_w = load_file(str(out / "best" / "drafter.safetensors"))
    assert torch.equal(drafter.fc.weight, best_w["fc.weight"].bfloat16().float())
    # A second run finds the finished checkpoint and does not train again.
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["resumed_from"] == 4 and again["steps"] == 4

"""`python -m eyas.train.run` end to end on the tiny target: shards in, SGLang folder out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eyas.errors import ConfigError
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
    # The teacher memo's bound, said once: 4 bytes a token of both splits (cut to 96 tokens).
    from eyas.train.data import OfflineSource

    held = sum(4 * min(n, 96) for root in (shards, eval_shards)
               for n in OfflineSource(root).lengths())
    assert printed.count("teacher memo:") == 1
    assert (f"teacher memo: the whole-vocabulary argmax once per sample, up to "
            f"{held / 1e6:,.1f} MB ({held:,} bytes) per process when full") in printed
    assert held > 0
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
    # Evaluation data that is missing or holds no shard means no evaluation, not an error.
    from eyas.train.config import TrainConfig
    from eyas.train.run import open_sources

    (tmp_path / "hidden" / "empty").mkdir()
    for missing in (tmp_path / "hidden" / "nope", tmp_path / "hidden" / "empty"):
        train_source, eval_source = open_sources("offline", shards, missing, tiny_target,
                                                 TrainConfig())
        assert eval_source is None and train_source.aux_layers == config["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"]


def test_command_carries_the_data_layers_and_remote_code_permission():
    from eyas.train.run import command, data_paths

    train, eval_ = data_paths(Path("/data/run"), "online")
    cmd = command("/venv/bin/python", data="online", train=str(train), eval_=str(eval_),
                  model="/models/kimi", out="/data/run/drafter", config_file="/data/run/t.yaml",
                  aux_layers=[1, 29, 57], trust_remote_code=True)
    assert cmd.startswith("/venv/bin/python -m eyas.train.run ") and "--log-format json" in cmd
    assert "--train-jsonl /data/run/merged/train.jsonl" in cmd
    assert "--eval-jsonl /data/run/merged/eval.jsonl" in cmd
    assert "--aux-layers 1,29,57" in cmd and cmd.endswith("--trust-remote-code")
    train, eval_ = data_paths(Path("/data/run"), "offline")
    cmd = command("/venv/bin/python", data="offline", train=str(train), eval_=str(eval_),
                  model="/models/kimi", out="/data/run/drafter", config_file="/data/run/t.yaml",
                  aux_layers=[1, 29, 57], trust_remote_code=True)
    assert "--shards /data/run/hidden/train --eval-shards /data/run/hidden/eval" in cmd
    assert "--aux-layers" not in cmd and "--trust-remote-code" not in cmd  # online only
    with pytest.raises(ConfigError, match="offline"):
        data_paths(Path("/data/run"), "shards")


def test_json_records_parse_back_and_read_as_the_text_lines(capsys):
    from eyas.train.run import format_record, parse_record, print_json_record

    train = {"step": 3, "loss": 1.5, "lr": 1e-4, "acc": [0.5, 0.25],
             "simulated_acceptance_length": 0.6, "tok_s": 120.0, "kind": "train"}
    evaluation = {"kind": "eval", "step": 4, "loss": 1.25, "acc": [0.5],
                  "simulated_acceptance_length": 0.5}
    print_json_record(train)
    print_json_record(evaluation)
    print(json.dumps({"steps": 4, "export": None}))  # the summary is not a record
    lines = capsys.readouterr().out.splitlines()
    assert [parse_record(line) for line in lines] == [train, evaluation, None]
    assert format_record(parse_record(lines[0])).startswith("step      3  loss 1.5000")
    assert format_record(parse_record(lines[1])).startswith("eval @    4  loss 1.2500")
    assert parse_record("step      3  loss 1.5") is None


def test_missing_training_data_is_a_data_error_naming_it(tmp_path):
    from eyas.errors import DataError
    from eyas.train.config import TrainConfig
    from eyas.train.run import open_sources

    with pytest.raises(DataError, match="no merged train data"):
        open_sources("online", tmp_path / "train.jsonl", tmp_path / "eval.jsonl", tmp_path,
                     TrainConfig())
    with pytest.raises(DataError, match="hidden-state shard"):
        open_sources("offline", tmp_path / "hidden" / "train", tmp_path / "hidden" / "eval",
                     tmp_path, TrainConfig())


def test_training_refuses_layers_sglang_cannot_name_before_it_starts(tmp_path):
    """A DeepSeek-family target's export cannot name a first layer of 0 (SGLang reads ids
    starting at 1 as "add one"): refused before anything is trained, not after days of it."""
    from eyas.train.config import TrainConfig
    from eyas.train.data import MemorySource
    from eyas.train.run import train_drafter

    model = tmp_path / "deepseek"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 7, "hidden_size": 64,
        "vocab_size": 100}))
    with pytest.raises(ConfigError, match=r"cannot capture layers \[0, 2, 3\]"):
        train_drafter(MemorySource([]), None, model, tmp_path / "out", TrainConfig(steps=1),
                      aux_layers=[0, 2, 3])
    assert not (tmp_path / "out" / "vocab").exists()


@pytest.mark.slow
def test_lk_objectives_train_on_the_tiny_target_end_to_end(tiny_target, tmp_path, capsys):
    """`--loss lk_log` / `lk_hybrid` through the whole command on the tiny target's shards:
    a finite loss that falls from the first steps to the last, and an export."""
    torch.set_num_threads(1)
    train = write_jsonl(tmp_path / "merged" / "train.jsonl", tiny_records(tiny_target, 8))
    evals = write_jsonl(tmp_path / "merged" / "eval.jsonl", tiny_records(tiny_target, 4, heldout=True))
    shards = extract_shards(tiny_target, train, tmp_path / "hidden" / "train", storage="final")
    eval_shards = extract_shards(tiny_target, evals, tmp_path / "hidden" / "eval", storage="final")
    for objective in ("lk_log", "lk_hybrid"):
        out = tmp_path / objective
        assert main(["--shards", str(shards), "--eval-shards", str(eval_shards), "--model",
                     str(tiny_target), "--out", str(out), "--loss", objective, "--steps", "10",
                     "--lr", "3e-3", "--warmup-steps", "1", "--eval-every", "10",
                     "--ttt-steps", "2", "--max-len", "96", "--micro-batch", "4",
                     "--log-every", "1", "--device", "cpu"]) == 0
        capsys.readouterr()
        history = json.loads((out / "history.json").read_text())
        losses = [h["loss"] for h in history if h["kind"] == "train"]
        assert len(losses) == 10 and all(map(math.isfinite, losses))
        assert sum(losses[-3:]) < sum(losses[:3]), (objective, losses)
        assert (out / "export" / "model.safetensors").exists()

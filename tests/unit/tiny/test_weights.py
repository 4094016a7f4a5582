"""The shipped tiny-target weights match the code's recipe; the script that makes them works."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from support.tiny_fixtures import shared_tokenizer_dir
from transformers import AutoTokenizer, LlamaForCausalLM

import eyas.tiny.model as tiny_model
from eyas.io import read_json, write_json
from eyas.tiny.weights import (
    RECORD,
    TOKENIZER,
    WEIGHTS,
    check_shipped,
    check_training_data,
    export_weights,
    load_model,
    read_record,
    recipe_fingerprint,
    shipped_dir,
    train_weights,
)


def test_shipped_weights_match_the_recipe():
    assert check_shipped() == []
    record = read_record()
    assert record["recipe"] == recipe_fingerprint()
    assert (shipped_dir() / WEIGHTS).stat().st_size < 20 * 2**20  # the size we accept in git
    assert record["stats"]["steps"] == record["settings"]["steps"]


@pytest.fixture
def shipped_copy(tmp_path) -> Path:
    folder = tmp_path / "tiny_target"
    shutil.copytree(shipped_dir(), folder)
    return folder


def test_check_names_a_changed_recipe(shipped_copy):
    record = read_json(shipped_copy / RECORD)
    record["recipe"] = "0123456789abcdef"
    write_json(shipped_copy / RECORD, record)
    (problem,) = check_shipped(shipped_copy)
    assert "0123456789abcdef" in problem and "python -m eyas.tiny.weights" in problem


def test_check_names_a_corrupt_or_missing_file(shipped_copy, tmp_path):
    data = (shipped_copy / WEIGHTS).read_bytes()
    (shipped_copy / WEIGHTS).write_bytes(data[: len(data) // 2])
    (shipped_copy / TOKENIZER).unlink()
    problems = check_shipped(shipped_copy)
    assert any(WEIGHTS in p and "SHA-256" in p for p in problems), problems
    assert any(TOKENIZER in p and "missing" in p for p in problems), problems
    assert "not found" in check_shipped(tmp_path / "nowhere")[0]


@pytest.mark.slow
def test_shipped_training_data_is_what_the_code_builds():
    problems = check_training_data()
    if problems is None:
        pytest.skip(f"weights trained on Python {read_record()['python']}; stdlib text differs")
    assert problems == []


def test_export_then_load_gives_the_float16_weights_with_a_tied_head(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(shared_tokenizer_dir())
    settings = tiny_model.TrainSettings()
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_model.tiny_llama_config(tokenizer, settings))
    export_weights(model, tmp_path)
    shutil.copyfile(shared_tokenizer_dir() / TOKENIZER, tmp_path / TOKENIZER)
    write_json(tmp_path / RECORD, {"settings": settings.to_json()})
    loaded = load_model(tmp_path)
    for name, tensor in model.state_dict().items():
        expected = tensor.to(torch.float16).to(torch.float32)
        assert torch.equal(loaded.state_dict()[name], expected), name
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


@dataclasses.dataclass(frozen=True)
class SmallSettings(tiny_model.TrainSettings):
    """A recipe small enough to train in seconds (the real one takes hours)."""

    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    steps: int = 4
    batch_rows: int = 2
    row_tokens: int = 64
    warmup_steps: int = 1


@pytest.fixture
def small_recipe(monkeypatch):
    """The code's recipe becomes SmallSettings; the training rows are encoded once."""
    monkeypatch.setattr(tiny_model, "TrainSettings", SmallSettings)
    cache: dict = {}
    real = tiny_model.packed_rows

    def packed_rows_once(tokenizer, settings):
        if settings not in cache:
            cache[settings] = real(tokenizer, settings)
        return cache[settings]

    monkeypatch.setattr(tiny_model, "packed_rows", packed_rows_once)


@pytest.mark.slow
def test_a_killed_training_resumes_to_the_same_weights(small_recipe, tmp_path, monkeypatch):
    tokenizer = AutoTokenizer.from_pretrained(shared_tokenizer_dir())
    settings = SmallSettings()
    straight, straight_stats = tiny_model.train_tiny_llama(tokenizer, settings)

    real_save = tiny_model._save_checkpoint

    def save_then_die(folder, state):
        real_save(folder, state)
        raise KeyboardInterrupt("killed after the first checkpoint")

    monkeypatch.setattr(tiny_model, "_save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        tiny_model.train_tiny_llama(tokenizer, settings, checkpoint_dir=tmp_path, checkpoint_every=2)
    monkeypatch.setattr(tiny_model, "_save_checkpoint", real_save)
    resumed, resumed_stats = tiny_model.train_tiny_llama(
        tokenizer, settings, checkpoint_dir=tmp_path, checkpoint_every=2
    )
    assert resumed_stats["final_loss"] == straight_stats["final_loss"]
    for (name, a), (_, b) in zip(
        straight.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name

    other = dataclasses.replace(settings, lr=1e-4)
    with pytest.raises(Exception, match="delete it to train from scratch"):
        tiny_model.train_tiny_llama(tokenizer, other, checkpoint_dir=tmp_path)


@pytest.mark.slow
def test_the_training_script_writes_weights_that_pass_the_check(small_recipe, tmp_path):
    out = train_weights(tmp_path / "tiny_target")
    assert sorted(p.name for p in out.iterdir()) == [WEIGHTS, RECORD, TOKENIZER]
    assert check_shipped(out) == []
    record = read_record(out)
    assert record["stats"]["steps"] == SmallSettings.steps
    assert record["answers"]["answers"] == 120
    assert 0.0 <= record["answers"]["distinct_2"] <= 1.0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers

"""The tiny target's training data mask and the determinism of its training."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.tiny_fixtures import shared_tokenizer_dir
from transformers import AutoTokenizer

from eyas.tiny.model import TrainSettings, encode_with_assistant_mask, train_tiny_llama


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(shared_tokenizer_dir())


def test_assistant_mask_covers_answers_and_their_end_token_only(tokenizer):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": " A1.", "reasoning_content": "R"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]
    ids, mask = encode_with_assistant_mask(tokenizer, messages)
    assert len(ids) == len(mask)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tokenize=False)
    learned = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert learned == "<think>\nR\n</think>\n A1.<|end|>A2<|end|>"


@pytest.mark.slow
def test_training_is_deterministic(tokenizer):
    settings = dataclasses.replace(TrainSettings(), steps=2, batch_rows=2, row_tokens=64)
    a, stats_a = train_tiny_llama(tokenizer, settings)
    b, stats_b = train_tiny_llama(tokenizer, settings)
    assert stats_a["final_loss"] == stats_b["final_loss"]
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name

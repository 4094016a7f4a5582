"""Fixtures for extraction tests: a small random Llama target and merged JSONL data."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eyas.io import dumps_line


def build_llama(out_dir: Path, *, layers: int = 8, hidden: int = 64, vocab: int = 300,
                tied: bool = False, seed: int = 0) -> Path:
    """Save a seeded random Llama (no tokenizer: extraction needs only token ids)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=tied)
    LlamaForCausalLM(config).save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def write_merged(path: Path, n: int, *, vocab: int = 300, seed: int = 0,
                 min_len: int = 3, max_len: int = 40) -> Path:
    """A merged JSONL file of `n` random records (id, dataset, input_ids, loss_mask)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        for i in range(n):
            t = rng.randint(min_len, max_len)
            ids = [rng.randrange(1, vocab) for _ in range(t)]
            mask = [0] * (t // 3) + [1] * (t - t // 3)
            fh.write(dumps_line({"id": f"s{i}", "dataset": "d", "input_ids": ids,
                                 "loss_mask": mask}))
    return path


@pytest.fixture(scope="session")
def llama8(tmp_path_factory) -> Path:
    """A random 8-layer Llama (hidden 64, untied head): default aux layers [1, 3, 4]."""
    return build_llama(tmp_path_factory.mktemp("llama8"))

"""The tiny tokenizer: deterministic, loads with AutoTokenizer offline, knows the chat format."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_fixtures import shared_tokenizer_dir
from transformers import AutoTokenizer

from eyas.tiny.template import CHAT_TEMPLATE, END_OF_TURN, MARKUP_TOKENS, SPECIAL_TOKENS
from eyas.tiny.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok_dir() -> Path:
    return shared_tokenizer_dir()


def test_build_is_deterministic_and_replaces_stale_files(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text("stale")
    again = build_tokenizer(tmp_path)
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
    assert (again / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()
    assert (again / "tokenizer_config.json").read_bytes() == (
        tok_dir / "tokenizer_config.json"
    ).read_bytes()


def test_autotokenizer_loads_with_chat_format(tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert 4096 <= len(tok) <= 4200
    assert tok.eos_token == END_OF_TURN
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert tok.chat_template == CHAT_TEMPLATE
    for token in SPECIAL_TOKENS + MARKUP_TOKENS:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1, f"{token} is not a single token: {ids}"


def test_round_trip_and_no_double_bos(tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    messages = [
        {"role": "user", "content": "What does `json.dumps` do? ünïcode ✓"},
        {"role": "assistant", "content": "Serialize obj.", "reasoning_content": "json"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    ids = tok(text)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids) == text
    think_id = tok.convert_tokens_to_ids("<think>")
    assert think_id in ids
    assert "<think>" in tok.decode(ids, skip_special_tokens=True)


def test_a_saved_tokenizer_json_rebuilds_the_same_folder(tok_dir, tmp_path):
    # The shipped tiny target carries only tokenizer.json; the rest must come back identical.
    from tokenizers import Tokenizer

    from eyas.tiny.tokenizer import save_tokenizer

    save_tokenizer(Tokenizer.from_file(str(tok_dir / "tokenizer.json")), tmp_path)
    names = sorted(p.name for p in tok_dir.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    for name in names:
        assert (tmp_path / name).read_bytes() == (tok_dir / name).read_bytes(), name

"""The Kimi-like tokenizer folder: loads through trust_remote_code and behaves like Kimi's."""

from __future__ import annotations

import json

import pytest
import tiktoken
from support.loss_mask_fixtures import build_kimi_test_tokenizer
from transformers import AutoTokenizer

from eyas.tiny import tokenization_kimi_like as remote
from eyas.tiny.kimi_template import SPECIAL_TOKEN_OFFSETS
from eyas.tiny.kimi_tokenizer import CJK_LINES, build_kimi_tokenizer, train_ranks


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_kimi_test_tokenizer(tmp_path_factory.mktemp("kimi"))


@pytest.fixture(scope="module")
def tok(folder):
    return AutoTokenizer.from_pretrained(folder, trust_remote_code=True)


def test_folder_is_laid_out_like_kimis(folder, tok):
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "chat_template.jinja",
        "tiktoken.model",
        "tokenization_kimi_like.py",
        "tokenizer_config.json",
    ]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_kimi_like.KimiLikeTokenizer"
    assert type(tok).__name__ == "KimiLikeTokenizer" and not tok.is_fast
    n_base = len((folder / "tiktoken.model").read_text().splitlines())
    assert len(tok) == tok.vocab_size == n_base + 256
    for offset, name in SPECIAL_TOKEN_OFFSETS.items():
        assert tok.convert_tokens_to_ids(name) == n_base + offset
    assert tok.convert_ids_to_tokens(n_base + 5) == f"<|reserved_token_{n_base + 5}|>"
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("[BOS]", "[EOS]", "[PAD]")


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! It's 2024.",
        "今天天气很好 and 日本語のテキスト",
        "x = [1, 22, 333, 4444]\n\n    return x\r\n",
        "spelled <|im_end|> and <think> tokens",
        "🙂 café",
    ],
)
def test_ids_are_tiktokens_with_kimis_pattern(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == tok.model.encode(text, allowed_special="all")
    assert tok.decode(ids) == text
    assert tok.model._pat_str == remote.PATTERN


def test_han_runs_split_from_surrounding_letters(tok):
    """Kimi's pattern: a run of Han characters is a piece of its own, even glued to letters.

    With ranks that could merge "c" and "今" into one token, the tokenizer's own pattern
    never does (a pattern whose letter class includes Han would).
    """
    glued = "c今".encode()
    ranks = {bytes([b]): b for b in range(256)}
    for k in range(2, len(glued) + 1):
        ranks[glued[:k]] = len(ranks)
    kimi = tiktoken.Encoding(
        "kimi", pat_str=tok.model._pat_str, mergeable_ranks=ranks, special_tokens={}
    )
    plain = tiktoken.Encoding(
        "plain", pat_str=r"\p{L}+|\s+", mergeable_ranks=ranks, special_tokens={}
    )
    merged = ranks[glued]
    assert merged in plain.encode_ordinary("abc今天")
    assert merged not in kimi.encode_ordinary("abc今天")


def test_long_runs_are_cut_like_kimis_class(tok):
    text = "a" * (remote.MAX_RUN_CHARS + 10)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    head = tok.model.encode_ordinary("a" * remote.MAX_RUN_CHARS)
    assert ids == head + tok.model.encode_ordinary("a" * 10)


def test_chat_template_defaults_are_kimis(tok):
    msgs = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs)  # tokenize=False, add_generation_prompt=True
    assert text == (
        "<|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    off = tok.apply_chat_template(msgs, thinking=False)
    assert off.endswith("<|im_middle|><think></think>")


def test_history_drops_reasoning_an_ongoing_tool_exchange_keeps_it(tok):
    call = {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "", "reasoning_content": "R2", "tool_calls": [call]},
        {"role": "tool", "content": "42", "tool_call_id": "functions.f:0", "name": "f"},
    ]
    text = tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert text == (
        "<|im_system|>system<|im_middle|>S<|im_end|>"
        "<|im_user|>user<|im_middle|>Q1<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
        "<|im_user|>user<|im_middle|>Q2<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>R2</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
        "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
        "<|im_system|>f<|im_middle|>## Return of functions.f:0\n42<|im_end|>"
    )


def test_tools_are_declared_first_with_sorted_keys(tok):
    tools = [{"type": "function", "function": {"parameters": {}, "name": "f"}}]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tools=tools)
    assert text.startswith(
        "<|im_system|>tool_declare<|im_middle|>"
        '[{"function":{"name":"f","parameters":{}},"type":"function"}]<|im_end|>'
        "<|im_user|>user<|im_middle|>Hi"
    )


def test_ranks_are_deterministic_and_cover_every_byte():
    texts = CJK_LINES * 5 + ["def f(x):\n    return x + 1\n"] * 5
    a, b = train_ranks(texts, 400), train_ranks(texts, 400)
    assert a == b
    assert {t[0] for t in a if len(t) == 1} == set(range(256))
    assert sorted(a.values()) == list(range(len(a)))


def test_builds_are_identical(tmp_path):
    texts = CJK_LINES * 5
    one = build_kimi_tokenizer(tmp_path / "one", texts=texts)
    two = build_kimi_tokenizer(tmp_path / "two", texts=texts)
    for p in sorted(one.iterdir()):
        assert p.read_bytes() == (two / p.name).read_bytes(), p.name
    assert not [p for p in one.iterdir() if p.name.startswith(".tmp-")]

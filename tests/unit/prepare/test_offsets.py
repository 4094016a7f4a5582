"""Token offsets for fast and tiktoken-based slow tokenizers (eyas.prepare.offsets)."""

from __future__ import annotations

import json

import pytest
from support.loss_mask_fixtures import build_kimi_test_tokenizer, build_test_tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizer

from eyas.prepare.loss_mask import TemplateError, probe_template
from eyas.prepare.offsets import (
    OffsetsError,
    encode_with_offsets,
    supports_offsets,
    tiktoken_encoding,
)
from eyas.prepare.tokenize import load_tokenizer

TEXTS = [
    "Hello world",
    "<|im_user|>user<|im_middle|>日本語のテキスト 今天天气很好<|im_end|>",
    "emoji 🙂🚀 and café, naïve — Ελληνικά\n\n\tindented",
    "a" * 50 + " " * 30 + "12345678",
    "",
]


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    return build_kimi_test_tokenizer(tmp_path_factory.mktemp("kimi"))


@pytest.fixture(scope="module")
def kimi_tok(kimi_dir):
    return AutoTokenizer.from_pretrained(kimi_dir, trust_remote_code=True)


@pytest.fixture(scope="module")
def fast_tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_test_tokenizer(tmp_path_factory.mktemp("tok")))


def _covered(text: str, offsets: list[tuple[int, int]]) -> str:
    return "".join(text[s:e] for s, e in offsets)


@pytest.mark.parametrize("text", TEXTS)
def test_tiktoken_offsets_tile_the_text_and_ids_are_the_tokenizers(kimi_tok, text):
    ((ids, offsets),) = encode_with_offsets(kimi_tok, [text])
    assert ids == kimi_tok(text, add_special_tokens=False)["input_ids"]
    assert len(offsets) == len(ids)
    assert all(e > s for s, e in offsets)  # never zero-width, even for a partial character
    # Consecutive tokens meet or overlap by one character (a character split between them).
    for (_, e1), (s2, _) in zip(offsets, offsets[1:], strict=False):
        assert s2 in (e1, e1 - 1)
    if ids:
        assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    # Each token's bytes lie inside the characters its span names.
    encoding = tiktoken_encoding(kimi_tok)
    for tok_id, (s, e) in zip(ids, offsets, strict=True):
        assert encoding.decode_single_token_bytes(tok_id) in text[s:e].encode("utf-8")


def test_a_character_split_between_tokens_belongs_to_both(kimi_tok):
    text = "🙂"  # 4 bytes; the small test vocabulary has no token for it
    ((ids, offsets),) = encode_with_offsets(kimi_tok, [text])
    assert len(ids) > 1
    assert offsets == [(0, 1)] * len(ids)


def test_fast_tokenizer_offsets_are_its_own(fast_tok):
    got = encode_with_offsets(fast_tok, TEXTS[:3])
    enc = fast_tok(TEXTS[:3], add_special_tokens=False, return_offsets_mapping=True)
    assert [ids for ids, _ in got] == enc["input_ids"]
    assert [offs for _, offs in got] == [[tuple(o) for o in offs] for offs in enc["offset_mapping"]]
    assert tiktoken_encoding(fast_tok) is None


def test_tokenizer_that_changes_the_text_is_refused(kimi_dir, tmp_path):
    """A special token that strips the whitespace before it (lstrip) makes the ids decode to
    other text: no mask is built from offsets that would be shifted."""
    folder = tmp_path / "lstrip"
    folder.mkdir()
    for p in kimi_dir.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for entry in config["added_tokens_decoder"].values():
        if entry["content"] == "<|im_end|>":
            entry["lstrip"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    with pytest.raises(OffsetsError, match="do not decode back"):
        encode_with_offsets(tok, ["answer   <|im_end|>"])


class _CharTokenizer(PreTrainedTokenizer):
    """A slow tokenizer with neither offsets nor a tiktoken encoding (one id per character)."""

    def __init__(self, **kwargs):
        self._vocab = {chr(i): i for i in range(32, 127)}
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self._vocab)

    def get_vocab(self):
        return dict(self._vocab)

    def _tokenize(self, text, **kwargs):
        return list(text)

    def _convert_token_to_id(self, token):
        return self._vocab.get(token, 0)

    def _convert_id_to_token(self, index):
        return chr(index)


def test_slow_tokenizer_without_tiktoken_is_refused_with_a_clear_error(tmp_path):
    tok = _CharTokenizer(eos_token="~")
    assert not supports_offsets(tok)
    with pytest.raises(OffsetsError, match="neither reports character offsets"):
        encode_with_offsets(tok, ["hi"])
    with pytest.raises(TemplateError, match="tiktoken"):
        probe_template(tok, "{% for m in messages %}{{ m['content'] }}~{% endfor %}")


def test_load_tokenizer_accepts_the_kimi_like_one_only_with_remote_code(kimi_dir):
    tok = load_tokenizer(kimi_dir, trust_remote_code=True)
    assert not tok.is_fast and supports_offsets(tok)
    with pytest.raises(ValueError):  # transformers refuses remote code it was not allowed
        load_tokenizer(kimi_dir, trust_remote_code=False)

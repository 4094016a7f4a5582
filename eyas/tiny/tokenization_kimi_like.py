"""A tiktoken-based slow tokenizer that behaves like Kimi-K2's, loaded with ``trust_remote_code``.

This file is copied verbatim into the tokenizer folders `eyas.tiny.kimi_tokenizer` builds and
named in their ``tokenizer_config.json`` (``auto_map``), so it must stand alone: it imports
only the standard library, ``tiktoken`` and ``transformers``. It is eyas's own code, written to
reproduce the behaviour of Kimi-K2/K2.5's ``TikTokenTokenizer`` (not a copy of it):

- a ``tiktoken.Encoding`` over the BPE ranks in ``tiktoken.model`` (base64 token + rank per
  line), with Kimi's pre-tokenizer pattern: a separate branch for runs of Han characters,
  letter runs that exclude Han, at most three digits per piece, punctuation with trailing
  newlines, and the usual whitespace branches;
- 256 reserved special tokens right after the base vocabulary, named by the
  ``added_tokens_decoder`` of ``tokenizer_config.json`` (``<|reserved_token_N|>`` otherwise);
  text that spells a special token is encoded as that token;
- long runs of whitespace or of non-whitespace are cut into pieces of at most 25,000
  characters (and the text into windows of 400,000) before encoding, as Kimi's class does to
  keep tiktoken from overflowing;
- a slow (Python) `transformers` tokenizer: no offsets mapping, no ``tokenizer.json``;
- ``apply_chat_template`` defaults to ``tokenize=False, add_generation_prompt=True`` and sorts
  the keys of ``tools`` recursively before rendering, as Kimi's class does.

Not reproduced: Kimi-K2.5's TypeScript-style rendering of tool declarations (its class passes a
``tools_ts_str`` to the template); the template here falls back to JSON, which only changes the
tool-declaration system turn.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

# Kimi-K2's pre-tokenizer: the Han branch comes first, and the letter branches exclude Han.
PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
NUM_RESERVED_SPECIAL = 256
WINDOW_CHARS = 400_000
MAX_RUN_CHARS = 25_000
VOCAB_FILE = "tiktoken.model"


def _byte_alphabet() -> dict[int, str]:
    """Byte -> printable character (GPT-2's byte-level mapping), for token strings."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR = _byte_alphabet()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _pieces(text: str) -> Iterator[str]:
    """`text` in windows of `WINDOW_CHARS`, each cut so no whitespace or non-whitespace run
    is longer than `MAX_RUN_CHARS` characters."""
    for w in range(0, len(text), WINDOW_CHARS):
        window = text[w : w + WINDOW_CHARS]
        start = run = 0
        in_space = window[:1].isspace()
        for i, ch in enumerate(window):
            if ch.isspace() != in_space:
                in_space, run = ch.isspace(), 1
            else:
                run += 1
                if run > MAX_RUN_CHARS:
                    yield window[start:i]
                    start, run = i, 1
        yield window[start:]


def _sorted_keys(obj: Any) -> Any:
    """`obj` with every dict's keys in sorted order (recursively)."""
    if isinstance(obj, dict):
        return {k: _sorted_keys(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted_keys(x) for x in obj]
    return obj


class KimiLikeTokenizer(PreTrainedTokenizer):
    """Slow tokenizer over a tiktoken encoding with Kimi's pattern and special-token layout."""

    vocab_files_names = {"vocab_file": VOCAB_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        bos_token: str = "[BOS]",
        eos_token: str = "[EOS]",
        unk_token: str = "[UNK]",
        pad_token: str = "[PAD]",
        added_tokens_decoder: dict | None = None,
        **kwargs: Any,
    ) -> None:
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(f"tiktoken ranks file not found: {vocab_file}")
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        named = {int(i): str(tok) for i, tok in (added_tokens_decoder or {}).items()}
        base = len(ranks)
        self.special_ids = {
            named.get(i, f"<|reserved_token_{i}|>"): i
            for i in range(base, base + NUM_RESERVED_SPECIAL)
        }
        self.model = tiktoken.Encoding(
            name=os.path.basename(vocab_file),
            pat_str=PATTERN,
            mergeable_ranks=ranks,
            special_tokens=self.special_ids,
        )
        # transformers' slow tokenizers work on token strings: each id's bytes, spelled with
        # the byte-level alphabet (special tokens keep their own text).
        self._id_to_str = [
            "".join(_BYTE_TO_CHAR[b] for b in self.model.decode_single_token_bytes(i))
            for i in range(base)
        ]
        self._id_to_str += sorted(self.special_ids, key=self.special_ids.__getitem__)
        self._str_to_id = {s: i for i, s in enumerate(self._id_to_str)}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=added_tokens_decoder,
            **kwargs,
        )

    # --------------------------------------------------------------- the tokenizer proper

    @property
    def vocab_size(self) -> int:
        return self.model.n_vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self._str_to_id)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        ids: list[int] = []
        for piece in _pieces(text):
            ids.extend(self.model.encode(piece, allowed_special="all"))
        return [self._id_to_str[i] for i in ids]

    def _convert_token_to_id(self, token: str) -> int:
        return self._str_to_id.get(token, self.special_ids.get(str(self.unk_token), 0))

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_str[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray()
        for token in tokens:
            if token in self.special_ids:
                data += token.encode("utf-8")
            else:
                data += bytes(_CHAR_TO_BYTE[c] for c in token)
        return data.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple:
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILE
        target = os.path.join(save_directory, name)
        if os.path.abspath(self.vocab_file) != os.path.abspath(target):
            shutil.copyfile(self.vocab_file, target)
        return (target,)

    # --------------------------------------------------------------- chat template defaults

    def apply_chat_template(
        self,
        conversation: Any,
        tools: list[dict] | None = None,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> Any:
        return super().apply_chat_template(
            conversation,
            tools=_sorted_keys(tools),
            tokenize=tokenize,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

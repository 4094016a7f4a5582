"""Token ids with the character span of each token, for any tokenizer eyas can mask.

Loss masks need to know which characters of the rendered text each token covers. Two kinds of
tokenizer give that exactly:

- **Fast (Rust) tokenizers** report it themselves (``return_offsets_mapping=True``).
- **tiktoken-based slow tokenizers** loaded with ``trust_remote_code`` (Kimi-K2's
  ``TikTokenTokenizer`` and its kin) do not, but they hold a ``tiktoken.Encoding``. The ids
  still come from the tokenizer itself (``tokenizer(text, add_special_tokens=False)``, the call
  ``apply_chat_template(..., tokenize=True)`` makes), so they are exactly what the target sees.
  The encoding then turns each id back into its bytes; their concatenation must equal the
  rendered text's UTF-8 bytes — a tokenizer that normalises or drops anything fails this check
  with a TemplateError instead of producing a shifted mask. Character spans follow from the
  bytes the same way tiktoken's ``decode_with_offsets`` counts them: a character belongs to
  every token holding one of its bytes, so a token that holds only part of a multi-byte
  character still overlaps it (never a zero-width span).

Such a tokenizer is never converted to a fast one: a fast tokenizer rebuilt with a default
pre-tokenizer pattern would split text differently (Kimi's pattern has a separate branch for
Han characters) and silently change the ids.

Spans are ``(start, end)`` character offsets into the text, ``end`` exclusive.
"""

from __future__ import annotations

from typing import Any

from eyas.errors import ConfigError

Offsets = list[tuple[int, int]]


class OffsetsError(ConfigError):
    """The tokenizer cannot report which characters each token covers."""


def tiktoken_encoding(tokenizer: Any) -> Any | None:
    """The ``tiktoken.Encoding`` a slow tokenizer wraps, or None when it holds none.

    Looks through the tokenizer object's attributes (in name order); Kimi's class keeps it in
    ``.model``. Imports tiktoken only when the tokenizer is not a fast one.
    """
    if getattr(tokenizer, "is_fast", False):
        return None
    try:
        import tiktoken
    except ImportError:
        return None
    for _, value in sorted(vars(tokenizer).items()):
        if isinstance(value, tiktoken.Encoding):
            return value
    return None


def supports_offsets(tokenizer: Any) -> bool:
    """Whether `encode_with_offsets` can serve `tokenizer` (fast, or slow over tiktoken)."""
    return bool(getattr(tokenizer, "is_fast", False)) or tiktoken_encoding(tokenizer) is not None


def require_offsets(tokenizer: Any, where: str = "tokenizer") -> None:
    """Raise OffsetsError, saying what would work, when `tokenizer` cannot report offsets."""
    if supports_offsets(tokenizer):
        return
    raise OffsetsError(
        f"{type(tokenizer).__name__} is a slow tokenizer that neither reports character "
        "offsets nor wraps a tiktoken encoding, so exact loss masks cannot be built; use its "
        "fast version (a tokenizer.json) or a tiktoken-based tokenizer",
        where=where,
    )


def encode_with_offsets(tokenizer: Any, texts: list[str]) -> list[tuple[list[int], Offsets]]:
    """``(input_ids, offsets)`` of each text, tokenized without adding special tokens.

    Raises OffsetsError for a tokenizer `supports_offsets` rejects, and when a tiktoken-based
    tokenizer's ids do not decode back to exactly the text they came from.
    """
    if not texts:
        return []
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            (list(ids), [tuple(o) for o in offs])
            for ids, offs in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
        ]
    encoding = tiktoken_encoding(tokenizer)
    if encoding is None:
        require_offsets(tokenizer)
    batch = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [
        (list(ids), _tiktoken_offsets(encoding, ids, text))
        for ids, text in zip(batch, texts, strict=True)
    ]


def _tiktoken_offsets(encoding: Any, ids: list[int], text: str) -> Offsets:
    """Character spans of `ids` under `encoding`, checked against `text`."""
    pieces = encoding.decode_tokens_bytes(ids)
    if b"".join(pieces) != text.encode("utf-8"):
        decoded = b"".join(pieces).decode("utf-8", errors="replace")
        at = next(
            (i for i, (a, b) in enumerate(zip(decoded, text, strict=False)) if a != b),
            min(len(decoded), len(text)),
        )
        raise OffsetsError(
            "the tokenizer's ids do not decode back to the text they were made from (first "
            f"difference at character {at}: {text[at : at + 40]!r} became "
            f"{decoded[at : at + 40]!r}); its tiktoken encoding and its tokenize() disagree"
        )
    offsets: Offsets = []
    chars = 0  # characters whose first byte has been seen
    for piece in pieces:
        # A piece that starts with a continuation byte (0b10xxxxxx) finishes the character
        # begun in the piece before it: it covers that character too.
        start = chars - 1 if piece and 0x80 <= piece[0] < 0xC0 else chars
        chars += sum(1 for byte in piece if not 0x80 <= byte < 0xC0)
        offsets.append((max(start, 0), chars))
    return offsets

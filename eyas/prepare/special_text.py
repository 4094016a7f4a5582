"""Answer text that spells the chat template's special tokens: the mark of a server run
without its reasoning and tool-call parsers.

A thinking target served without a reasoning parser returns ``reasoning</think>answer`` in
``content``; without a tool-call parser its tool calls come back as text between the
template's tool-call markers (Kimi-K2.5 on SGLang: ``--reasoning-parser kimi_k2
--tool-call-parser kimi_k2``, both off by default). Rendered by the chat template, such a
turn becomes ``<think></think>reasoning</think>answer``: a sequence the target never writes,
and the drafter would learn it. A tokenizer also encodes such text as the special token
itself, so the turn's structure breaks, not just its text.

Which strings count (`template_markers`)
    Every added token of the target's tokenizer (special or not: Qwen3's and Kimi's
    ``<think>`` are added tokens without being "special") whose text the chat template
    writes -- found in the template's source or in a small conversation it renders -- plus
    the tokenizer's declared special tokens (bos, eos, pad, unk...). Strings shorter than 3
    characters or made of whitespace only are left out (some tokenizers add ``"\\n\\n"``-like
    tokens that any text holds). Nothing is hard-coded per model: it works for any template
    whose markers are added tokens.

Phase 1 (`eyas.prepare.generate`) and phase 2 (`eyas.prepare.tokenize`) both check an
assistant turn's ``content`` and ``reasoning_content``; a hit is a DataError of kind
``special-text`` (see `tokenize.on_bad_record`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from eyas.conversation import Conversation
from eyas.errors import DataError

KIND = "special-text"
"""The reject reason of a turn that spells a special token."""

MIN_MARKER_LEN = 3

KIMI_TOOL_SECTION = "<|tool_calls_section_begin|>"
"""Kimi's tool-call section marker: its presence in the tokenizer names Kimi's parsers."""
KIMI_FLAGS = "--reasoning-parser kimi_k2 --tool-call-parser kimi_k2"

_PROBE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
    {"role": "user", "content": "V"},
]


@dataclass(frozen=True)
class SpecialText:
    """The special strings of one tokenizer + template, and the check against them."""

    markers: tuple[str, ...]
    """The strings, longest first."""

    def __post_init__(self) -> None:
        alternation = "|".join(re.escape(m) for m in self.markers)
        object.__setattr__(self, "_pattern", re.compile(alternation) if alternation else None)

    def find(self, text: str | None) -> re.Match | None:
        """The first special string in `text` (leftmost, longest), or None."""
        pattern = self._pattern  # type: ignore[attr-defined]
        if not text or pattern is None:
            return None
        return pattern.search(text)

    def check(self, conv: Conversation) -> DataError | None:
        """A DataError (kind ``special-text``) for the first assistant turn whose content or
        reasoning spells a special string, or None when every turn is clean."""
        for i, m in enumerate(conv.messages):
            if m.role != "assistant":
                continue
            for part, text in (("content", m.content), ("reasoning_content", m.reasoning_content)):
                hit = self.find(text)
                if hit is None:
                    continue
                at = hit.start()
                context = text[max(0, at - 40): at + len(hit.group()) + 40]  # type: ignore[index]
                return DataError(
                    f"sample {conv.id!r}: assistant turn {i}'s {part} spells the chat "
                    f"template's special token {hit.group()!r} as text (at character {at}: "
                    f"{context!r}); a server without a reasoning / tool-call parser returns "
                    f"such answers ({server_hint(self.markers)})",
                    path=conv.meta.get("path"),
                    line=conv.meta.get("line"),
                    field=f"messages[{i}].{part}",
                    kind=KIND,
                )
        return None


def template_markers(tokenizer: Any, chat_template: str | None = None) -> SpecialText:
    """The special strings of `tokenizer` with `chat_template` (its own when None); see the
    module docstring for which strings count."""
    template = chat_template if chat_template is not None else tokenizer.chat_template
    if isinstance(template, dict):  # named templates: any of them may be used
        template = "\n".join(str(t) for t in template.values())
    written = str(template or "")
    try:
        written += "\n" + tokenizer.apply_chat_template(
            _PROBE, tokenize=False, chat_template=chat_template, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - the source alone still names the literal markers
        pass
    added = {str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()}
    found = {t for t in added if t in written}
    found |= {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    markers = sorted(
        (t for t in found if len(t) >= MIN_MARKER_LEN and t.strip()),
        key=lambda t: (-len(t), t),
    )
    return SpecialText(tuple(markers))


def server_hint(markers: tuple[str, ...] | list[str]) -> str:
    """What to change on the server, in words: Kimi's parser flags when the tokenizer has
    Kimi's tool-call markers, generic wording otherwise."""
    if KIMI_TOOL_SECTION in markers:
        return f"start SGLang with {KIMI_FLAGS}"
    return ("start the server with this model's reasoning parser and tool-call parser, e.g. "
            "SGLang's --reasoning-parser NAME --tool-call-parser NAME")

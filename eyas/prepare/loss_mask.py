"""Assistant-only loss masks for any chat template, with or without ``{% generation %}`` markers.

The drafter learns to predict exactly the tokens the target writes itself: in each assistant
turn, its reasoning (when the template renders it and ``train_on_reasoning`` is set), its answer,
its tool calls, and the end-of-turn token that closes the turn. Everything else (system prompt,
user and tool turns, role headers, the template's glue) gets mask 0.

How (no markers needed, so it works for Kimi's, Llama 3's and Qwen3's real templates):

1. **Probe the template once** per (tokenizer, template):
   - the *assistant header* is what ``add_generation_prompt=True`` appends to a one-user-turn
     conversation (``<|im_start|>assistant\\n``);
   - the *end-of-turn string* is what follows a sentinel answer in a rendered probe
     conversation, up to and including the first added (special) token
     (``<|im_end|>``, ``<|eot_id|>``); the newline a template prints after it is glue, not
     something the model writes, and stays unmasked.
   It also notes whether the generation prompt ends in an open think tag (``<think>``: a
   thinking prompt, after which the model writes ``reasoning</think>answer``) and whether the
   template drops the reasoning of a final assistant turn (Kimi-K2.5's does).
2. **Render** the conversation to text (``tokenize=False``), as the target's server did, and
   walk it forward in turn order with a cursor. The final assistant turn is rendered per
   ``final_turn`` (``tokenize.final_turn``):
   - ``as_template``: the whole conversation as the template renders it. Kimi's template
     renders every finished answer as history, ``<think></think>answer``: the reasoning the
     target wrote is not in the text, and never trained.
   - ``as_generated``: the prompt the target answered last (the earlier messages as the
     template showed them to it, then the generation prompt ``...<think>``) followed by what
     it wrote: ``reasoning</think>answer<|im_end|>``, i.e. the template's rendering of the
     final turn with the reasoning put back before the closing tag. Earlier turns render as
     in that prompt: history for Kimi (no reasoning), but an ongoing tool exchange keeps the
     reasoning the target saw.
   - ``auto`` (default): ``as_generated`` for a thinking generation prompt, else
     ``as_template`` (the two agree for templates that render the final reasoning, Qwen3's).

   The walk:
   - an assistant turn starts at the next header after the cursor; its reasoning (if any) is
     searched after the header, its content after the reasoning, its end-of-turn string after
     the content — each search bounded so it cannot leak into a later turn;
   - a user/system/tool turn's content moves the cursor past it (when found before the next
     header), so an answer that repeats the user's words is never matched inside the question.
3. **Supervised character spans** per assistant turn:
   - ``train_on_reasoning=True``: from the end of the header to the end of the end-of-turn
     string — so whatever the template renders in between (``<think>`` block, even an empty
     one, the answer, tool calls) is what the model would generate after the generation prompt;
   - ``train_on_reasoning=False``: from the start of the content to the end of the end-of-turn
     string (the reasoning block stays in ``input_ids`` as context, unmasked).
4. **Tokenize** the rendered text (``add_special_tokens=False``: the template already wrote
   BOS) with the character span of every token (`eyas.prepare.offsets`) and mark every token
   whose span overlaps a supervised span.

Edge-case decisions:

- *Cut answers.* A turn the server cut at ``max_tokens`` (``Message.truncated``) was never
  closed by the target: its span ends with the last text the target wrote (its content, else
  its reasoning), so what the template closes it with -- an end-of-think tag, the end-of-turn
  string -- stays unsupervised (unless `supervise_truncated_end`).

- *Straddling tokens.* A token that overlaps a supervised span only in part (BPE merged a
  template newline with the content's first newline, say) is masked: it contains text the
  assistant wrote, and predicting one token of glue is harmless, while dropping the first token
  of every answer is not. Special tokens never straddle, so the end-of-turn token is exact.
- *Rewritten content.* If a turn's content is not found verbatim, the same text stripped of
  surrounding newlines, then of all surrounding whitespace, is tried (Qwen3 strips answers and
  reasoning). If none is found — the template dropped or rewrote the turn — a `DataError`
  names the sample id, the turn index and its file/line: never a silently empty mask.
- *Dropped reasoning.* Reasoning the template does not render (Qwen3 drops it for assistant
  turns before the last user query, Kimi for every finished answer but the final one
  ``as_generated``) is simply not in the input and not supervised. `reasoning_counts` counts,
  per sample, the reasoning tokens the target generated and those supervised (all turns, and
  the final turn alone), so phase 2 can report and warn about it.
- *Empty content* (a turn made only of tool calls): the span starts where the content would be.
- A conversation without any assistant turn is an error (nothing to learn).

Templates are always rendered with an explicit ``add_generation_prompt`` (False for a whole
conversation): Kimi's tokenizer class defaults it to True, which would append an empty
assistant turn to every sample.

Tokenizers: fast (Rust) ones, which report offsets, and tiktoken-based slow ones loaded with
``trust_remote_code`` (Kimi's), whose offsets come from their tiktoken encoding with a
decoded-equals-rendered check (`eyas.prepare.offsets`). Any other slow tokenizer is refused.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from eyas.conversation import Conversation
from eyas.errors import ConfigError, DataError
from eyas.prepare.offsets import OffsetsError, encode_with_offsets, supports_offsets

# Sentinels for probing a template: plain lowercase words every byte-level BPE can encode and
# that no real conversation contains.
_PROBE_USER = "eyasprobequestionqx"
_PROBE_ANSWER_1 = "eyasprobeanswerqa"
_PROBE_ANSWER_2 = "eyasprobeanswerqb"
_PROBE_REASONING = "eyasprobereasoningqr"


class TemplateError(ConfigError):
    """The chat template cannot be probed (no end-of-turn marker, no assistant header...)."""


@dataclass(frozen=True)
class TemplateProbe:
    """What the probe learned about a chat template."""

    header: str | None
    """Text that opens an assistant turn (the generation prompt), or None when unknown."""
    end_of_turn: str
    """Text that closes an assistant turn: up to and including the first added token."""
    think_open: str | None = None
    """The open think tag the generation prompt ends in (``<think>``: a thinking generation
    prompt, after which the model writes ``reasoning</think>answer``), or None."""
    drops_final_reasoning: bool = False
    """The template does not render the reasoning of a conversation's final assistant turn
    (Kimi-K2.5's renders every finished answer as history, ``<think></think>`` + content)."""


FINAL_TURN_MODES = ("auto", "as_generated", "as_template")


def final_turn_mode(setting: str, probe: TemplateProbe) -> str:
    """``as_generated`` or ``as_template`` for a ``tokenize.final_turn`` setting: ``auto`` is
    ``as_generated`` for a thinking generation prompt (`TemplateProbe.think_open`)."""
    if setting not in FINAL_TURN_MODES:
        raise ConfigError(f"tokenize.final_turn must be one of {FINAL_TURN_MODES}, not {setting!r}")
    if setting == "auto":
        return "as_generated" if probe.think_open else "as_template"
    return setting


@dataclass(frozen=True)
class Reasoning:
    """Where one assistant turn's ``reasoning_content`` went in the rendered text."""

    text: str
    final: bool
    """It belongs to the conversation's final assistant turn."""
    span: tuple[int, int] | None
    """Its ``[start, end)`` characters in the rendered text; None when not rendered."""


@dataclass(frozen=True)
class Rendered:
    """A conversation rendered to text, with the character spans the drafter learns."""

    text: str
    spans: list[tuple[int, int]]
    """Sorted, disjoint ``[start, end)`` character spans of supervised text."""
    reasoning: list[Reasoning] = field(default_factory=list)
    """Every assistant turn's reasoning (turns that have some), rendered or not."""


def _render(
    tokenizer: Any,
    messages: list[dict],
    *,
    chat_template: str | None,
    add_generation_prompt: bool = False,
    **kwargs,
) -> str:
    # Explicit add_generation_prompt: some tokenizer classes (Kimi's) default it to True.
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )


def probe_template(tokenizer: Any, chat_template: str | None = None) -> TemplateProbe:
    """Discover the assistant header and end-of-turn string of a chat template.

    Raises TemplateError when the template renders no added token after an assistant answer
    (the end of a turn could not be told from the next turn), or when the tokenizer cannot
    report character offsets (a slow tokenizer not built on tiktoken).
    """
    if not supports_offsets(tokenizer):
        raise TemplateError(
            f"{type(tokenizer).__name__} is a slow tokenizer that neither reports character "
            "offsets nor wraps a tiktoken encoding; loss masks need one of the two. Load its "
            "fast version (use_fast=True, a tokenizer.json)."
        )
    user = [{"role": "user", "content": _PROBE_USER}]
    header: str | None = None
    try:
        bare = _render(tokenizer, user, chat_template=chat_template, add_generation_prompt=False)
        prompt = _render(tokenizer, user, chat_template=chat_template, add_generation_prompt=True)
        if prompt.startswith(bare) and prompt[len(bare) :].strip():
            header = prompt[len(bare) :]
        convo = [
            user[0],
            {"role": "assistant", "content": _PROBE_ANSWER_1},
            {"role": "user", "content": _PROBE_USER},
            {"role": "assistant", "content": _PROBE_ANSWER_2},
        ]
        text = _render(tokenizer, convo, chat_template=chat_template)
        thought = [user[0], {"role": "assistant", "content": _PROBE_ANSWER_1,
                             "reasoning_content": _PROBE_REASONING}]
        drops = _PROBE_REASONING not in _render(tokenizer, thought, chat_template=chat_template)
    except Exception as exc:  # jinja errors of any kind: report which template failed
        raise TemplateError(
            f"the chat template failed to render a probe conversation: {exc}"
        ) from exc
    pos = text.find(_PROBE_ANSWER_1)
    if pos < 0:
        raise TemplateError("the chat template does not render assistant content verbatim")
    tail = text[pos + len(_PROBE_ANSWER_1) :]
    end_of_turn = _first_added_token_prefix(tokenizer, tail)
    if end_of_turn is None:
        raise TemplateError(
            "cannot find the end-of-turn token: no added/special token follows an assistant "
            f"answer in the rendered template (text after the answer: {tail[:80]!r})"
        )
    return TemplateProbe(header=header, end_of_turn=end_of_turn,
                         think_open=_open_think_tag(tokenizer, header),
                         drops_final_reasoning=drops)


_OPEN_TAG = re.compile(r"<([A-Za-z_][\w-]*)>\s*$")


def _open_think_tag(tokenizer: Any, header: str | None) -> str | None:
    """The tag a generation prompt ends in when it opens a thought: an added token ``<x>``
    (trailing whitespace allowed) whose name holds "think" and whose ``</x>`` is an added
    token too (``<think>``, Kimi's and DeepSeek-R1's); None otherwise."""
    m = _OPEN_TAG.search(header or "")
    if not m or "think" not in m.group(1).lower():
        return None
    added = {str(t) for t in tokenizer.added_tokens_decoder.values()}
    tag = f"<{m.group(1)}>"
    return tag if tag in added and f"</{m.group(1)}>" in added else None


def _first_added_token_prefix(tokenizer: Any, tail: str) -> str | None:
    """`tail` up to and including its first added token, or None when it has none."""
    added = {str(t) for t in tokenizer.added_tokens_decoder.values()}
    try:
        ((ids, offsets),) = encode_with_offsets(tokenizer, [tail])
    except OffsetsError as exc:
        raise TemplateError(str(exc)) from exc
    for tok_id, (start, end) in zip(ids, offsets, strict=True):
        if end > start and (tail[start:end] in added or tok_id in tokenizer.all_special_ids):
            return tail[:end]
    return None


_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_probe(tokenizer: Any, chat_template: str | None = None) -> TemplateProbe:
    """`probe_template`, computed once per tokenizer object and template text."""
    per_tok = _PROBES.setdefault(tokenizer, {})
    if chat_template not in per_tok:
        per_tok[chat_template] = probe_template(tokenizer, chat_template)
    return per_tok[chat_template]


def _where(conv: Conversation) -> dict:
    return {"path": conv.meta.get("path"), "line": conv.meta.get("line")}


def _find_variant(text: str, needle: str, start: int, stop: int) -> tuple[int, int] | None:
    """Find `needle` (or its newline-/whitespace-stripped form) in ``text[start:stop]``."""
    seen = set()
    for variant in (needle, needle.strip("\n"), needle.strip()):
        if variant in seen:
            continue
        seen.add(variant)
        if not variant:
            return None
        pos = text.find(variant, start, stop)
        if pos >= 0:
            return pos, pos + len(variant)
    return None


@dataclass
class _Turn:
    """Where one assistant turn lies in a rendered text."""

    index: int
    start: int
    """End of its header: where the model's output begins."""
    reasoning: tuple[int, int] | None
    content: tuple[int, int]
    end: int
    """End of its end-of-turn string."""


def _locate_turns(text: str, conv: Conversation, probe: TemplateProbe,
                  messages: int | None = None) -> list[_Turn]:
    """Walk `text` in turn order and locate the first `messages` messages' assistant turns.

    Raises DataError (sample id, turn, source line) for a turn whose content or end-of-turn
    marker is not where it must be.
    """
    eot = probe.end_of_turn
    header = probe.header
    turns: list[_Turn] = []
    cursor = 0
    n = len(text)
    for i, msg in enumerate(conv.messages[:messages]):
        field_ = f"messages[{i}]"
        if msg.role != "assistant":
            # Skip past this turn's text when it sits before the next assistant header.
            stop = text.find(header, cursor) if header else -1
            found = _find_variant(text, msg.content, cursor, stop if stop >= 0 else n)
            if found:
                cursor = found[1]
            continue

        for part, text_ in (("content", msg.content), ("reasoning_content", msg.reasoning_content)):
            if text_ and eot in text_:
                raise DataError(
                    f"sample {conv.id!r}: assistant turn {i} contains the template's "
                    f"end-of-turn marker {eot!r} in its text",
                    field=f"{field_}.{part}",
                    **_where(conv),
                )
        start = cursor
        if header:
            h = text.find(header, cursor)
            if h >= 0:
                start = h + len(header)
            elif probe.think_open and header.rstrip().endswith(probe.think_open):
                # A thinking prompt's template may render finished turns without the open tag
                # (Qwen3-2507's before the last query, DeepSeek-R1's): the bare header.
                bare = header[: header.rstrip().rfind(probe.think_open)]
                h = text.find(bare, cursor) if bare else -1
                if h >= 0:
                    start = h + len(bare)
        turn_end = text.find(eot, start)
        # Content or reasoning might legitimately contain the end-of-turn text only if it is
        # not a special token; bound searches by the next end-of-turn after the header.
        bound = turn_end if turn_end >= 0 else n

        r = _find_variant(text, msg.reasoning_content, start, bound) if msg.reasoning_content else None
        content_from = r[1] if r else start
        if msg.content:
            c = _find_variant(text, msg.content, content_from, bound)
            if c is None and content_from != start:
                # What looked like the reasoning was the content itself: the reasoning is not
                # rendered (Kimi's history turns, where an answer may repeat its thought).
                r = None
                c = _find_variant(text, msg.content, start, bound)
            if c is None:
                raise DataError(
                    f"sample {conv.id!r}: assistant turn {i}'s content was not found in the "
                    "text the chat template rendered (the template dropped or rewrote it), so "
                    "its loss mask cannot be built",
                    field=f"{field_}.content",
                    **_where(conv),
                )
        else:
            c = (content_from, content_from)
        e = text.find(eot, c[1])
        if e < 0:
            raise DataError(
                f"sample {conv.id!r}: assistant turn {i} is not closed by the end-of-turn "
                f"marker {eot!r} in the rendered text",
                field=field_,
                **_where(conv),
            )
        turns.append(_Turn(i, start, r, c, e + len(eot)))
        cursor = e + len(eot)
    return turns


def _as_generated(tokenizer: Any, conv: Conversation, messages: list[dict], text: str,
                  probe: TemplateProbe, render: Any) -> str:
    """The conversation as the target produced its final turn: the prompt it answered
    (the earlier messages and the generation prompt, rendered by the template) followed by
    what it wrote after that prompt.

    What it wrote is the final turn as the template renders it (`text`) from its header on;
    a template that drops the final turn's reasoning (Kimi's) renders an empty thought there
    (``</think>answer``), and the reasoning goes back in front of the closing tag, where the
    model wrote it after the generation prompt's open tag. A conversation that does not end
    with an assistant turn is rendered as the template renders it.
    """
    final = conv.messages[-1]
    if final.role != "assistant" or not probe.header:
        return text
    f = len(conv.messages) - 1
    prompt = render(messages[:f], add_generation_prompt=True)
    if not prompt.endswith(probe.header):
        return text
    turns = _locate_turns(text, conv, probe)
    if not turns or turns[-1].index != f:
        return text
    last = turns[-1]
    if text[last.start - len(probe.header):last.start] != probe.header:
        # The template renders a finished turn without the generation prompt's open tag
        # (DeepSeek-R1's drops the whole thought): where the model's output begins in it is
        # unknown. Left as the template renders it; the reasoning counts show what is lost.
        return text
    tail = text[last.start:]
    if final.reasoning_content and last.reasoning is None and probe.think_open:
        if tail.lstrip().startswith(probe.think_open.replace("<", "</", 1)):
            tail = final.reasoning_content + tail
    return prompt + tail


def render_with_spans(
    tokenizer: Any,
    conv: Conversation,
    *,
    train_on_reasoning: bool = True,
    chat_template: str | None = None,
    probe: TemplateProbe | None = None,
    supervise_truncated_end: bool = False,
    final_turn: str = "auto",
) -> Rendered:
    """Render `conv` with the chat template and locate its supervised character spans.

    `final_turn` (``tokenize.final_turn``): ``as_template`` renders the whole conversation
    with the template; ``as_generated`` renders the prompt the target answered last (the
    earlier messages as the template showed them to it, plus the generation prompt) followed
    by what it wrote (``reasoning</think>answer<|im_end|>`` for Kimi), see `_as_generated`;
    ``auto`` is ``as_generated`` for a thinking generation prompt (`final_turn_mode`).

    A turn cut at ``max_tokens`` (`Message.truncated`) is supervised up to the last text the
    target wrote, not its closing end-of-turn string; `supervise_truncated_end` supervises the
    turn as any other.

    Raises DataError (naming the sample id, turn and source line) when an assistant turn's
    content or its end-of-turn marker cannot be found in the rendered text, or when the
    conversation has no assistant turn.
    """
    probe = probe or cached_probe(tokenizer, chat_template)
    mode = final_turn_mode(final_turn, probe)
    messages = [m.to_openai() for m in conv.messages]
    kwargs: dict[str, Any] = {}
    if conv.tools:
        kwargs["tools"] = conv.tools

    def render(msgs: list[dict], add_generation_prompt: bool = False) -> str:
        try:
            return _render(tokenizer, msgs, chat_template=chat_template,
                           add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as exc:  # a jinja raise_exception or a type error inside the template
            raise DataError(
                f"sample {conv.id!r}: the chat template failed to render it: {exc}", **_where(conv)
            ) from exc

    text = render(messages)
    if mode == "as_generated":
        text = _as_generated(tokenizer, conv, messages, text, probe, render)

    turns = _locate_turns(text, conv, probe)
    if not turns:
        raise DataError(
            f"sample {conv.id!r}: no assistant turn (nothing for the drafter to learn)",
            field="messages",
            **_where(conv),
        )
    spans: list[tuple[int, int]] = []
    for t in turns:
        begin = t.start if train_on_reasoning else t.content[0]
        if conv.messages[t.index].truncated and not supervise_truncated_end:
            # Cut mid-turn: what the template adds after the last text the target wrote (a
            # closing think tag, the end-of-turn token) is not the target's. When none of its
            # text is rendered (a template that drops the last turn's reasoning), nothing is.
            spans.append((begin, max(begin, t.content[1])))
        else:
            spans.append((begin, t.end))
    final = turns[-1].index
    reasoning = [
        Reasoning(conv.messages[t.index].reasoning_content or "", t.index == final, t.reasoning)
        for t in turns
        if conv.messages[t.index].reasoning_content
    ]
    return Rendered(text=text, spans=spans, reasoning=reasoning)


def reasoning_counts(tokenizer: Any, rendered: Rendered, offsets: list[tuple[int, int]],
                     mask: list[int]) -> dict[str, int]:
    """Reasoning tokens the target generated and those supervised, over all assistant turns
    and over the final one: ``reasoning_tokens``, ``reasoning_supervised``,
    ``final_reasoning_tokens``, ``final_reasoning_supervised``.

    Rendered reasoning counts the tokens overlapping it (`offsets`: the rendered text's token
    spans, `mask`: its loss mask); reasoning the template did not render counts its own
    tokens, none supervised.
    """
    out = dict.fromkeys(REASONING_KEYS, 0)
    for r in rendered.reasoning:
        if r.span is None:
            n = len(tokenizer(r.text, add_special_tokens=False)["input_ids"])
            sup = 0
        else:
            a, b = r.span
            inside = [k for k, (s, e) in enumerate(offsets) if s < b and e > a]
            n, sup = len(inside), sum(mask[k] for k in inside)
        out["reasoning_tokens"] += n
        out["reasoning_supervised"] += sup
        if r.final:
            out["final_reasoning_tokens"] += n
            out["final_reasoning_supervised"] += sup
    return out


REASONING_KEYS = ("reasoning_tokens", "reasoning_supervised", "final_reasoning_tokens",
                  "final_reasoning_supervised")


def mask_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token whose ``[start, end)`` overlaps a supervised span, else 0.

    `spans` must be sorted and disjoint; `offsets` ascending (as tokenizers return them).
    A zero-width token counts when its position lies inside a span.
    """
    mask = [0] * len(offsets)
    k = 0
    for t, (s, e) in enumerate(offsets):
        while k < len(spans) and spans[k][1] <= s:
            k += 1
        if k == len(spans):
            break
        a, b = spans[k]
        if (e > s and s < b and e > a) or (e == s and a <= s < b):
            mask[t] = 1
    return mask


def tokenize_rendered(tokenizer: Any, rendered: Rendered) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one rendered conversation."""
    ((ids, offsets),) = encode_with_offsets(tokenizer, [rendered.text])
    return ids, mask_from_offsets(offsets, rendered.spans)


def tokenize_conversation(
    tokenizer: Any,
    conv: Conversation,
    *,
    train_on_reasoning: bool = True,
    chat_template: str | None = None,
    supervise_truncated_end: bool = False,
    final_turn: str = "auto",
) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of `conv` under the tokenizer's (or the given) chat template.

    `loss_mask[i]` is 1 exactly on the tokens of each assistant turn's output — reasoning (when
    `train_on_reasoning` and rendered), content, tool calls and the closing end-of-turn token
    (not for a turn cut at ``max_tokens``, unless `supervise_truncated_end`) — see the module
    docstring for the algorithm and edge cases. `input_ids` equals
    ``apply_chat_template(conv, tokenize=True)`` when the final turn is rendered
    ``as_template``; ``as_generated`` (`final_turn`), they are the tokens of the final turn's
    prompt (``add_generation_prompt=True``) followed by what the target wrote. Raises
    DataError for a turn that cannot be located and TemplateError for a template that cannot
    be probed or a tokenizer without offsets (see `eyas.prepare.offsets`).
    """
    rendered = render_with_spans(
        tokenizer, conv, train_on_reasoning=train_on_reasoning, chat_template=chat_template,
        supervise_truncated_end=supervise_truncated_end, final_turn=final_turn,
    )
    ids, mask = tokenize_rendered(tokenizer, rendered)
    if not any(mask):
        raise DataError(f"sample {conv.id!r}: the loss mask is empty", **_where(conv))
    return ids, mask

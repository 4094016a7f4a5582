"""Question/answer conversations about the standard library, the tiny target's whole world.

A user asks about a documented object ("What does `json.dumps` do?") and the assistant answers
with the first paragraph(s) of its docstring. Objects are split once, by a hash of their name,
into a training part (the tiny target learns those exact prompts) and a held-out part (never
trained on; used for evaluation prompts). Everything here is deterministic.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from eyas.tiny.corpus import DocItem, iter_docitems

HELDOUT_MODULUS = 10
"""One object in this many (by name hash) is held out of training."""

MAX_ANSWER_CHARS = 480
_RULE = re.compile(r"^[=\-~*^#]{3,}$")

# Phrasings the tiny target is trained on, by object kind.
TRAIN_QUESTIONS = {
    "module": ["Summarise the module `{name}`.", "What is the `{name}` module for?"],
    "class": ["What is `{name}`?", "Explain the class `{name}`."],
    "function": ["What does `{name}` do?", "Explain `{name}`."],
    "method": ["What does the method `{name}` do?", "Explain `{name}`."],
}
# Different phrasings, for demo prompts and evaluation (never in the training set).
OTHER_QUESTIONS = {
    "module": ["Give me an overview of `{name}`.", "Tell me about the `{name}` module."],
    "class": ["Describe the class `{name}`.", "What is the purpose of `{name}`?"],
    "function": ["How do I use `{name}`?", "Tell me what `{name}` is for."],
    "method": ["Describe `{name}`.", "What is `{name}` used for?"],
}

SYSTEM_PROMPTS = [
    "You are a helpful assistant who knows the Python standard library.",
    "Answer briefly, in plain English.",
    "You are a Python documentation bot.",
]


@dataclass(frozen=True)
class QA:
    """One documented object with its answer text."""

    item: DocItem
    answer: str

    @property
    def name(self) -> str:
        return self.item.name

    @property
    def kind(self) -> str:
        return self.item.kind


def stable_hash(text: str) -> int:
    """A process-independent integer hash of `text` (Python's `hash` is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def is_heldout(name: str) -> bool:
    """True for objects never used in the tiny target's training data."""
    return stable_hash(name) % HELDOUT_MODULUS == 0


def answer_text(doc: str, max_chars: int = MAX_ANSWER_CHARS) -> str:
    """The first paragraph(s) of a docstring, unwrapped, at most about `max_chars` long.

    Paragraphs are added while they fit; indented blocks (examples, tables) end the answer.
    The first paragraph alone is cut at a sentence or word boundary when too long.
    """
    paragraphs = [p for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]
    out: list[str] = []
    for para in paragraphs:
        lines = para.splitlines()
        if out and any(line.startswith((" ", "\t", ">>>")) for line in lines):
            break
        # Underlines of reST headings carry no words.
        text = " ".join(line.strip() for line in lines if not _RULE.match(line.strip()))
        if out and len("\n\n".join([*out, text])) > max_chars:
            break
        out.append(text)
    answer = "\n\n".join(out)
    if len(answer) > max_chars:
        cut = answer[:max_chars]
        end = max(cut.rfind(". "), cut.rfind(".\n"))
        answer = cut[: end + 1] if end > max_chars // 3 else cut.rsplit(" ", 1)[0] + " ..."
    return answer


@functools.lru_cache(maxsize=1)
def all_qa() -> tuple[QA, ...]:
    """Every documented object with a non-trivial answer, in stable order, unique by name.

    Computed once per process (parsing the standard library takes a second or two).
    """
    seen: set[str] = set()
    out = []
    for item in iter_docitems():
        if item.name in seen:
            continue
        answer = answer_text(item.doc)
        if len(answer) < 12:
            continue
        seen.add(item.name)
        out.append(QA(item, answer))
    return tuple(out)


def split_qa() -> tuple[list[QA], list[QA]]:
    """``(train, heldout)`` split of `all_qa()` by name hash."""
    train, heldout = [], []
    for qa in all_qa():
        (heldout if is_heldout(qa.name) else train).append(qa)
    return train, heldout


def question(qa: QA, *, phrasing: int = 0, train: bool = True) -> str:
    """The user's question about `qa`, in one of the training (or other) phrasings."""
    table = TRAIN_QUESTIONS if train else OTHER_QUESTIONS
    options = table[qa.kind]
    return options[phrasing % len(options)].format(name=qa.name)


def training_messages(qa: QA) -> list[dict[str, str]]:
    """The one training conversation for `qa` (phrasing and system prompt chosen by hash)."""
    h = stable_hash("train:" + qa.name)
    messages = []
    if h % 5 == 0:
        messages.append(
            {"role": "system", "content": SYSTEM_PROMPTS[(h >> 8) % len(SYSTEM_PROMPTS)]}
        )
    messages.append({"role": "user", "content": question(qa, phrasing=h >> 16)})
    messages.append({"role": "assistant", "content": qa.answer})
    return messages

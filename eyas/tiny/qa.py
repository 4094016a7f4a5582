"""Question/answer conversations about the standard library, the tiny target's whole world.

A user asks about a documented object and the assistant answers, the way a small assistant
model would:

- what it does ("What does `json.dumps` do?"): often a sentence that places the object
  (``"`json.dumps(obj, *, skipkeys=False, ...)` is a function in `json`."``), then the first
  paragraph(s) of its docstring;
- its parameters ("What arguments does `json.dumps` take?"), read from its signature;
- an example call (for module-level functions), as a Python code block;
- its members (methods of a class, classes and functions of a module).

Questions of the last three kinds come alone or as a follow-up turn ("What arguments does it
take?"). Objects are split once, by a hash of their name, into a training part (the tiny target
learns those exact prompts) and a held-out part (never trained on, used for evaluation prompts:
no question or generated answer names a held-out function or method, nor lists a held-out
member; a held-out class or module is named only as the owner of trained objects, and a
docstring may mention anything). Everything here is deterministic.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass

from eyas.tiny.corpus import DocItem, iter_docitems

HELDOUT_MODULUS = 10
"""One object in this many (by name hash) is held out of training."""

MAX_ANSWER_CHARS = 400
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

    Paragraphs are added while they fit; indented blocks (examples, tables) end the answer,
    and so does a later paragraph that only introduces one (ends with a colon).
    The first paragraph alone is cut at a sentence or word boundary when too long.
    """
    paragraphs = [p for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]
    out: list[str] = []
    for para in paragraphs:
        lines = para.splitlines()
        if out and any(line.startswith((" ", "\t", ">>>")) for line in lines):
            break
        if out and para.rstrip().endswith(":"):
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


# --------------------------------------------------------------------------- signatures

_NUMBERS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
LEAD_SIGNATURE_CHARS = 48
"""A signature longer than this is shown in the lead sentence as ``(a, b, ...)``."""


@dataclass(frozen=True)
class Param:
    """One parameter of a function's signature."""

    name: str
    kind: str
    """``positional``, ``keyword`` (keyword-only), ``varargs`` or ``varkw``."""
    default: str | None
    """The default's source text, None when the parameter has none."""


def parameters(qa: QA) -> list[Param] | None:
    """The parameters of a function or method (without ``self``/``cls``); None for others."""
    if qa.kind not in ("function", "method") or not qa.item.signature:
        return None
    try:
        args = ast.parse(f"def f{qa.item.signature}: pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError:
        return None
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = [
        Param(a.arg, "positional", None if d is None else ast.unparse(d))
        for a, d in zip(positional, defaults, strict=True)
    ]
    if args.vararg:
        out.append(Param(args.vararg.arg, "varargs", None))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        out.append(Param(a.arg, "keyword", None if d is None else ast.unparse(d)))
    if args.kwarg:
        out.append(Param(args.kwarg.arg, "varkw", None))
    if qa.kind == "method" and out and out[0].name in ("self", "cls"):
        out = out[1:]
    return out


def short_signature(params: list[Param], max_chars: int = LEAD_SIGNATURE_CHARS) -> str:
    """``(a, b=1, *args)``; parameters that do not fit in `max_chars` become ``...``."""
    parts = []
    keyword_marker = False
    for p in params:
        if p.kind == "keyword" and not keyword_marker:
            if not any(q.kind == "varargs" for q in params):
                parts.append("*")
            keyword_marker = True
        if p.kind == "varargs":
            parts.append(f"*{p.name}")
            keyword_marker = True
        elif p.kind == "varkw":
            parts.append(f"**{p.name}")
        else:
            parts.append(p.name if p.default is None else f"{p.name}={p.default}")
    text = "(" + ", ".join(parts) + ")"
    while len(text) > max_chars and parts:
        parts.pop()
        text = "(" + ", ".join([*parts, "..."]) + ")"
    return text


def _join(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _describe(p: Param) -> str:
    if p.kind == "varargs":
        return f"any number of extra positional arguments (`*{p.name}`)"
    if p.kind == "varkw":
        return f"arbitrary keyword arguments (`**{p.name}`)"
    text = f"`{p.name}`"
    if p.kind == "keyword":
        text = "the keyword-only " + text
    if p.default is not None and len(p.default) <= 24:
        text += f" (default `{p.default}`)"
    elif p.default is not None:
        text += " (optional)"
    return text


# --------------------------------------------------------------------------- answers


@functools.lru_cache(maxsize=1)
def _owners() -> tuple[dict[str, list[str]], dict[str, list[QA]]]:
    """Training objects by owner: methods of each class, top-level objects of each module."""
    methods: dict[str, list[str]] = defaultdict(list)
    top: dict[str, list[QA]] = defaultdict(list)
    for qa in all_qa():
        if is_heldout(qa.name):
            continue
        owner, _, short = qa.name.rpartition(".")
        if qa.kind == "method":
            methods[owner].append(short)
        elif qa.kind in ("class", "function") and owner == qa.item.module:
            top[owner].append(qa)
    return methods, top


LEADS = {
    "module": ["`{name}` is a module of the standard library.", "The `{name}` module:"],
    "class": ["`{name}` is a class in `{module}`.", "The class `{short}` lives in `{module}`."],
    "function": ["`{name}{sig}` is a function in `{module}`.", "`{short}{sig}` comes from `{module}`."],
    "method": ["`{short}{sig}` is a method of `{owner}`.", "`{owner}.{short}{sig}` is a method."],
}


def lead_sentence(qa: QA, variant: int) -> str:
    """A sentence that places `qa` (module, owner class, short signature)."""
    owner, _, short = qa.name.rpartition(".")
    params = parameters(qa)
    options = LEADS[qa.kind]
    return options[variant % len(options)].format(
        name=qa.name,
        short=short,
        owner=owner,
        module=qa.item.module,
        sig="" if params is None else short_signature(params),
    )


def reply(qa: QA) -> str:
    """The assistant's answer to "what does it do": three in four start with a lead sentence."""
    h = stable_hash("lead:" + qa.name)
    if h % 4 == 3:
        return qa.answer
    return lead_sentence(qa, h >> 8) + ("\n\n" if qa.kind == "module" else " ") + qa.answer


def signature_answer(qa: QA) -> str | None:
    """``"`f` takes two arguments: `a` and `b` (default `1`)."``; None without parameters."""
    params = parameters(qa)
    if not params:  # None, or no parameters: nothing worth a question
        return None
    count = _NUMBERS[len(params)] if len(params) < len(_NUMBERS) else str(len(params))
    described = [_describe(p) for p in params]
    if len(params) == 1:
        return f"`{qa.name}` takes one argument, {described[0]}."
    return f"`{qa.name}` takes {count} arguments: {_join(described)}."


def usage_answer(qa: QA) -> str | None:
    """An example call of a module-level function as a code block; None for others."""
    params = parameters(qa)
    if params is None or qa.kind != "function" or qa.name.rpartition(".")[0] != qa.item.module:
        return None
    args = [p.name for p in params if p.default is None and p.kind == "positional"]
    args += [f"{p.name}={p.name}" for p in params if p.default is None and p.kind == "keyword"]
    call = f"{qa.name}({', '.join(args)})"
    if qa.answer.startswith(("Return", "Create", "Make", "Build", "Get")):
        call = "result = " + call
    intro = ["For example:", f"Import `{qa.item.module}` and call it:"][stable_hash(qa.name) % 2]
    return f"{intro}\n\n```python\nimport {qa.item.module}\n\n{call}\n```"


def members_answer(qa: QA) -> str | None:
    """Methods of a class, or classes and functions of a module; None when there are none."""
    methods, top = _owners()

    def listed(names: list[str], limit: int) -> str:
        shown = [f"`{n}`" for n in names[:limit]]
        if len(names) > limit:
            return ", ".join(shown) + f" and {len(names) - limit} more"
        return _join(shown)

    if qa.kind == "class" and methods.get(qa.name):
        return f"Methods of `{qa.name}` include {listed(methods[qa.name], 8)}."
    if qa.kind == "module" and top.get(qa.name):
        classes = [m.name.rpartition(".")[2] for m in top[qa.name] if m.kind == "class"]
        functions = [m.name.rpartition(".")[2] for m in top[qa.name] if m.kind == "function"]
        parts = []
        if classes:
            parts.append(("the class " if len(classes) == 1 else "the classes ") + listed(classes, 6))
        if functions:
            parts.append(
                ("the function " if len(functions) == 1 else "the functions ")
                + listed(functions, 6)
            )
        return f"`{qa.name}` provides " + ", and ".join(parts) + "."
    return None


# Questions of the other kinds: alone (with the object's name) or as a follow-up ("it").
INTENT_QUESTIONS = {
    "signature": ["What arguments does `{name}` take?", "What are the parameters of `{name}`?"],
    "usage": ["Show how to call `{name}`.", "Give an example call of `{name}`."],
    "members": ["What does `{name}` contain?", "List the members of `{name}`."],
}
OTHER_INTENT_QUESTIONS = {
    "signature": ["Which parameters does `{name}` accept?", "List the arguments of `{name}`."],
    "usage": ["How would I call `{name}`?", "Write a call to `{name}`."],
    "members": ["What is in `{name}`?", "Which members does `{name}` have?"],
}
FOLLOW_UPS = {
    "signature": ["What arguments does it take?", "And its parameters?"],
    "usage": ["Show me how to call it.", "Can you give an example?"],
    "members": ["What does it contain?", "Which members does it have?"],
}


def intent_answers(qa: QA) -> dict[str, str]:
    """``{intent: answer}`` for the question kinds other than "what does it do" that apply."""
    out = {}
    for intent, answer in (
        ("signature", signature_answer(qa)),
        ("usage", usage_answer(qa)),
        ("members", members_answer(qa)),
    ):
        if answer:
            out[intent] = answer
    return out


def intent_question(qa: QA, intent: str, *, phrasing: int = 0, train: bool = True) -> str:
    """The user's question of kind `intent` about `qa` (training or other phrasings)."""
    options = (INTENT_QUESTIONS if train else OTHER_INTENT_QUESTIONS)[intent]
    return options[phrasing % len(options)].format(name=qa.name)


def _follow_up(qa: QA) -> str | None:
    """The intent asked as a follow-up in `qa`'s training conversation (one object in three)."""
    intents = sorted(intent_answers(qa))
    h = stable_hash("follow-up:" + qa.name)
    if not intents or h % 3:
        return None
    return intents[(h >> 8) % len(intents)]


def training_messages(qa: QA) -> list[dict[str, str]]:
    """`qa`'s main training conversation (phrasing, system prompt and follow-up by hash)."""
    h = stable_hash("train:" + qa.name)
    messages = []
    if h % 5 == 0:
        messages.append(
            {"role": "system", "content": SYSTEM_PROMPTS[(h >> 8) % len(SYSTEM_PROMPTS)]}
        )
    messages.append({"role": "user", "content": question(qa, phrasing=h >> 16)})
    messages.append({"role": "assistant", "content": reply(qa)})
    follow = _follow_up(qa)
    if follow:
        options = FOLLOW_UPS[follow]
        messages.append({"role": "user", "content": options[(h >> 24) % len(options)]})
        messages.append({"role": "assistant", "content": intent_answers(qa)[follow]})
    return messages


def training_conversations(qa: QA) -> list[list[dict[str, str]]]:
    """Every training conversation about `qa`: the main one, then one per other intent."""
    conversations = [training_messages(qa)]
    follow = _follow_up(qa)
    for intent, answer in sorted(intent_answers(qa).items()):
        if intent == follow:
            continue
        phrasing = stable_hash(f"{intent}:{qa.name}")
        conversations.append(
            [
                {"role": "user", "content": intent_question(qa, intent, phrasing=phrasing)},
                {"role": "assistant", "content": answer},
            ]
        )
    return conversations

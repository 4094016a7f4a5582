"""The tiny target's training conversations: their answer forms, and held-out objects kept out."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from eyas.tiny.corpus import DocItem
from eyas.tiny.qa import (
    QA,
    Param,
    lead_sentence,
    members_answer,
    parameters,
    reply,
    short_signature,
    signature_answer,
    split_qa,
    training_conversations,
    usage_answer,
)


def qa_of(name: str, kind: str = "function", signature: str = "", doc: str = "Return x.") -> QA:
    module = name.rpartition(".")[0] if kind == "function" else name.rsplit(".", 2)[0]
    return QA(DocItem(name, kind, doc, signature, module), doc)


def test_parameters_read_every_kind_and_drop_self():
    qa = qa_of("m.C.f", "method", "(self, a, b=1, *args, key=None, **kw)")
    assert parameters(qa) == [
        Param("a", "positional", None),
        Param("b", "positional", "1"),
        Param("args", "varargs", None),
        Param("key", "keyword", "None"),
        Param("kw", "varkw", None),
    ]
    assert parameters(qa_of("m.C", "class")) is None
    assert short_signature(parameters(qa)) == "(a, b=1, *args, key=None, **kw)"
    assert short_signature(parameters(qa), max_chars=16) == "(a, b=1, ...)"
    assert short_signature(parameters(qa_of("m.f", signature="(a, *, key)"))) == "(a, *, key)"


def test_answer_forms():
    f = qa_of("json.dumps", signature="(obj, *, indent=None)", doc="Serialize obj.")
    assert signature_answer(f) == (
        "`json.dumps` takes two arguments: `obj` and the keyword-only `indent` (default `None`)."
    )
    assert signature_answer(qa_of("m.C.f", "method", "(self)")) is None  # nothing to ask
    assert usage_answer(f).endswith(":\n\n```python\nimport json\n\njson.dumps(obj)\n```")
    returns = qa_of("m.f", signature="(a, b=2)", doc="Return a.")
    assert usage_answer(returns).endswith("\n\nresult = m.f(a)\n```")
    assert usage_answer(qa_of("m.C.f", "method", "(self, a)")) is None
    assert lead_sentence(f, 0) == "`json.dumps(obj, *, indent=None)` is a function in `json`."
    assert reply(f).endswith("Serialize obj.")


@pytest.fixture(scope="module")
def split():
    return split_qa()


def test_training_conversations_end_with_answers_and_vary_in_form(split):
    train, _ = split
    conversations = [c for qa in train for c in training_conversations(qa)]
    assert len(conversations) > 1.5 * len(train)
    assert all(c[-1]["role"] == "assistant" and c[-1]["content"].strip() for c in conversations)
    turns = Counter(sum(m["role"] == "user" for m in c) for c in conversations)
    assert turns[2] > 0.05 * len(conversations)  # follow-up questions
    answers = [m["content"] for c in conversations for m in c if m["role"] == "assistant"]
    assert sum("```python" in a for a in answers) > 300
    assert sum(a.startswith("Methods of") for a in answers) > 100
    assert sum(" takes " in a and " argument" in a for a in answers) > 500


def test_held_out_functions_and_methods_are_never_named_in_training_text(split):
    train, heldout = split
    # (A held-out class or module still owns trained methods or functions, so its name shows;
    # a docstring may mention anything: only the text written around docstrings is checked.)
    held = {qa.name for qa in heldout if qa.kind in ("function", "method")}
    named = set()
    for qa in train:
        for conversation in training_conversations(qa):
            for message in conversation:
                text = message["content"].replace(qa.answer, "")
                named.update(re.findall(r"`([\w.]+)", text))
    assert not named & held
    owners = {qa.name for qa in train if qa.kind in ("class", "module")}
    assert any(members_answer(qa) for qa in train if qa.name in owners)

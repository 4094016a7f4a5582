"""Deterministic demo datasets about the standard library, in the formats users bring.

``write_demo_datasets(out_dir)`` writes five JSONL files (and a ``manifest.json``):

- ``demo_chat.jsonl`` (300): prompts in OpenAI ``messages`` form ending with a user turn,
  some with a system prompt, some multi-turn with earlier assistant answers, some asking for
  parameters, an example call or members instead of what an object does; meant to be
  answered again by the target (regeneration).
- ``demo_sharegpt.jsonl`` (150): ShareGPT ``conversations`` (``from``: system/human/gpt,
  ``value``) with answers, meant to be kept as given.
- ``demo_long.jsonl`` (30): long multi-turn ``messages`` conversations (several thousand
  characters each): the outlier dataset with few samples and a large token share.
- ``demo_reasoning.jsonl`` (50): ``messages`` whose assistant turns carry ``reasoning_content``.
- ``eval_prompts.jsonl`` (60): held-out prompts (``messages`` form) about objects the tiny
  target never saw in training, for drafter evaluation.

The same Python version gives byte-identical JSONL files.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from eyas.io import AtomicJsonlWriter
from eyas.manifest import write_manifest
from eyas.tiny.qa import (
    QA,
    SYSTEM_PROMPTS,
    answer_text,
    intent_answers,
    intent_question,
    question,
    reply,
    split_qa,
    stable_hash,
)

DEMO_DATA_VERSION = 2
"""Bump when the demo datasets change: the cached copy (``demo-data-v<N>``) is rebuilt."""
COUNTS = {
    "demo_chat": 300,
    "demo_sharegpt": 150,
    "demo_long": 30,
    "demo_reasoning": 50,
    "eval_prompts": 60,
}
LONG_MIN_CHARS = 4000
LONG_MAX_CHARS = 14000


def _ranked(items: list[QA], salt: str) -> list[QA]:
    """`items` in a seeded, process-independent order (by hash of salt and name)."""
    return sorted(items, key=lambda qa: (stable_hash(salt + qa.name), qa.name))


def _module_of(qa: QA) -> str:
    return qa.item.module


def _chat(train: list[QA]) -> list[dict]:
    by_module = defaultdict(list)
    for qa in train:
        by_module[_module_of(qa)].append(qa)
    records = []
    for i, qa in enumerate(_ranked(train, "chat:")[: COUNTS["demo_chat"]]):
        h = stable_hash("chat-shape:" + qa.name)
        messages: list[dict] = []
        if h % 4 == 0:
            messages.append({"role": "system", "content": SYSTEM_PROMPTS[h % len(SYSTEM_PROMPTS)]})
        siblings = [s for s in by_module[_module_of(qa)] if s.name != qa.name]
        if h % 7 == 0 and siblings:
            first = siblings[(h >> 8) % len(siblings)]
            messages.append({"role": "user", "content": question(first, phrasing=h >> 4)})
            messages.append({"role": "assistant", "content": reply(first)})
        intents = sorted(intent_answers(qa))
        if intents and (h >> 20) % 4 == 0:  # a question about parameters, usage or members
            intent = intents[(h >> 24) % len(intents)]
            ask = intent_question(qa, intent, phrasing=h >> 12, train=False)
        else:
            ask = question(qa, phrasing=h >> 12, train=False)
        messages.append({"role": "user", "content": ask})
        records.append({"id": f"demo-chat-{i:04d}", "messages": messages})
    return records


def _sharegpt(train: list[QA]) -> list[dict]:
    ranked = _ranked(train, "sharegpt:")
    records = []
    for i in range(COUNTS["demo_sharegpt"]):
        qa = ranked[i]
        h = stable_hash("sharegpt-shape:" + qa.name)
        conv = []
        if h % 5 == 0:
            conv.append({"from": "system", "value": SYSTEM_PROMPTS[h % len(SYSTEM_PROMPTS)]})
        conv.append({"from": "human", "value": question(qa, phrasing=h >> 8, train=False)})
        conv.append({"from": "gpt", "value": reply(qa)})
        if h % 3 == 0:
            other = ranked[COUNTS["demo_sharegpt"] + i]
            conv.append({"from": "human", "value": question(other, phrasing=h >> 16)})
            conv.append({"from": "gpt", "value": reply(other)})
        records.append({"id": f"demo-sharegpt-{i:04d}", "conversations": conv})
    return records


def _long(train: list[QA]) -> list[dict]:
    turns_by_module: dict[str, list[tuple[QA, str]]] = defaultdict(list)
    for qa in sorted(train, key=lambda q: q.name):
        turns_by_module[_module_of(qa)].append((qa, answer_text(qa.item.doc, max_chars=2500)))
    modules = [
        m
        for m, turns in turns_by_module.items()
        if sum(len(answer) for _, answer in turns) >= LONG_MIN_CHARS
    ]
    modules = sorted(modules, key=lambda m: (stable_hash("long:" + m), m))
    records = []
    for i, module in enumerate(modules[: COUNTS["demo_long"]]):
        messages = [
            {
                "role": "system",
                "content": f"You are helping a developer read the source of `{module}`.",
            }
        ]
        size = 0
        for qa, answer in turns_by_module[module]:
            turn = [
                {"role": "user", "content": question(qa, phrasing=len(messages))},
                {"role": "assistant", "content": answer},
            ]
            messages += turn
            size += sum(len(m["content"]) for m in turn)
            if size >= LONG_MAX_CHARS:
                break
        records.append({"id": f"demo-long-{i:04d}", "messages": messages})
    return records


def _reasoning(train: list[QA]) -> list[dict]:
    records = []
    for i, qa in enumerate(_ranked(train, "reasoning:")[: COUNTS["demo_reasoning"]]):
        first_sentence = qa.answer.split(". ")[0].rstrip(".")
        reasoning = (
            f"The user asks about the {qa.kind} `{qa.name}` in the module `{_module_of(qa)}`. "
            f'Its documentation starts with "{first_sentence}". '
            "I will answer with that summary."
        )
        messages = [
            {"role": "user", "content": question(qa, phrasing=i, train=False)},
            {"role": "assistant", "content": reply(qa), "reasoning_content": reasoning},
        ]
        records.append({"id": f"demo-reasoning-{i:04d}", "messages": messages})
    return records


def _eval(heldout: list[QA]) -> list[dict]:
    records = []
    for i, qa in enumerate(_ranked(heldout, "eval:")[: COUNTS["eval_prompts"]]):
        phrasing = stable_hash("eval-shape:" + qa.name)
        intents = sorted(intent_answers(qa))
        if intents and (phrasing >> 20) % 4 == 0:  # parameters, usage or members
            intent = intents[(phrasing >> 24) % len(intents)]
            ask = intent_question(qa, intent, phrasing=phrasing, train=i % 2 == 0)
        else:
            ask = question(qa, phrasing=phrasing, train=i % 2 == 0)
        messages = [{"role": "user", "content": ask}]
        records.append({"id": f"eval-{i:04d}", "messages": messages})
    return records


def build_demo_records() -> dict[str, list[dict]]:
    """The demo datasets as lists of records, keyed by dataset name (no files written)."""
    train, heldout = split_qa()
    return {
        "demo_chat": _chat(train),
        "demo_sharegpt": _sharegpt(train),
        "demo_long": _long(train),
        "demo_reasoning": _reasoning(train),
        "eval_prompts": _eval(heldout),
    }


def write_demo_datasets(out_dir: Path) -> dict[str, Path]:
    """Write the demo datasets into `out_dir` (atomically, plus a manifest).

    Returns ``{dataset name: path}`` for ``demo_chat``, ``demo_sharegpt``, ``demo_long``,
    ``demo_reasoning`` and ``eval_prompts`` (files ``<name>.jsonl``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    counts: dict[str, int] = {}
    for name, records in build_demo_records().items():
        path = out_dir / f"{name}.jsonl"
        with AtomicJsonlWriter(path) as writer:
            for record in records:
                writer.write(record)
        paths[name] = path
        counts[name] = len(records)
    write_manifest(
        out_dir,
        phase="demo-data",
        outputs=[p.name for p in paths.values()],
        config={"counts": COUNTS},
        counts=counts,
    )
    return paths

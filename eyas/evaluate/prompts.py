"""Held-out prompts for the evaluator, and the guarantee that none of them was trained on.

Two sources, each grouped into datasets (τ is reported per dataset):

- the merged eval split (``merged/eval.jsonl``, records ``{"id", "dataset", "input_ids",
  "loss_mask"}``): a record's prompt is its tokens before the first supervised one, i.e. the
  context of its first answer;
- JSONL files (or gzip-compressed JSONL, ``.jsonl.gz``) of ``{"id", "messages"}`` (the last
  turn a user's), or of ``{"task_id", "prompt"}`` (HumanEval's shape: the prompt is one user
  turn; a ``prompt`` without ``task_id`` is not a prompt), rendered with the target's chat template and its generation prompt; one dataset
  per file, named by its stem (``HumanEval.jsonl.gz`` → ``HumanEval``).

A prompt whose tokens equal the prompt of a training record (``merged/train.jsonl``, same
rule) is left out and counted: a drafter scored on its training prompts says nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eyas.errors import DataError
from eyas.io import iter_jsonl


@dataclass(frozen=True)
class Prompt:
    """One held-out prompt: token ids of the target, and the dataset it belongs to."""

    id: str
    dataset: str
    ids: tuple[int, ...]


@dataclass(frozen=True)
class NoPrompt:
    """A record of a prompt file that holds no prompt: skipped, and named in the report."""

    where: str
    """``file:line``."""
    why: str


@dataclass
class PromptSelection:
    """The prompts chosen and what was left out, for the report."""

    prompts: list[Prompt]
    left_out_training: int = 0
    """Prompts equal to a training record's prompt."""
    left_out_long: int = 0
    """Prompts longer than ``max_prompt_tokens``."""
    left_out_empty: int = 0
    """Records with no prompt (supervised from their first token, no supervised token, or a
    prompt-file record without messages)."""
    sources: list[str] | None = None
    skipped: list[str] = field(default_factory=list)
    """Prompt-file records without a prompt: ``file:line: why``."""

    def counts(self) -> dict[str, Any]:
        per: dict[str, int] = {}
        for p in self.prompts:
            per[p.dataset] = per.get(p.dataset, 0) + 1
        return {"count": len(self.prompts), "per_dataset": dict(sorted(per.items())),
                "left_out_training": self.left_out_training,
                "left_out_long": self.left_out_long, "left_out_empty": self.left_out_empty,
                "skipped": self.skipped[:SKIPPED_LISTED],
                "sources": self.sources or []}


def prompt_of_record(input_ids: list[int], loss_mask: list[int]) -> list[int] | None:
    """The tokens before the first supervised one; None when there is no such prompt."""
    for i, m in enumerate(loss_mask):
        if m:
            return list(input_ids[:i]) if i > 0 else None
    return None


def _key(ids: Iterable[int]) -> bytes:
    return hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=16).digest()


def training_prompt_keys(train_jsonl: Path) -> set[bytes]:
    """Hashes of every training record's prompt (streamed: one line in memory at a time)."""
    keys = set()
    for _, rec in iter_jsonl(train_jsonl):
        prompt = prompt_of_record(rec.get("input_ids") or [], rec.get("loss_mask") or [])
        if prompt:
            keys.add(_key(prompt))
    return keys


def merged_prompts(eval_jsonl: Path) -> Iterator[Prompt | None]:
    """The prompts of the merged eval split, in file order (None for a record without one).

    Raises DataError naming the file and line for a record without ``input_ids`` /
    ``loss_mask`` lists of equal length.
    """
    for lineno, rec in iter_jsonl(eval_jsonl):
        ids, mask = rec.get("input_ids"), rec.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
            raise DataError("expected input_ids and loss_mask lists of equal length",
                            path=eval_jsonl, line=lineno, field="input_ids")
        prompt = prompt_of_record(ids, mask)
        yield (Prompt(str(rec.get("id", f"line-{lineno}")), str(rec.get("dataset", "eval")),
                      tuple(prompt)) if prompt else None)


def render_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of `messages` with the chat template's generation prompt appended."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:  # BatchEncoding in some versions
        out = out["input_ids"]
    return [int(i) for i in out]


def prompt_file_stem(path: str | Path) -> str:
    """A prompt file's dataset name: its name without ``.jsonl`` / ``.jsonl.gz``."""
    name = Path(path).name
    for suffix in (".jsonl.gz", ".json.gz", ".gz", ".jsonl", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def file_prompts(path: Path, tokenizer: Any,
                 dataset: str | None = None) -> Iterator[Prompt | NoPrompt]:
    """The prompts of a ``{"id", "messages"}`` (or HumanEval ``{"task_id", "prompt"}``) JSONL file,
    rendered with `tokenizer`; a
    `NoPrompt` (``file:line`` and why) for a record without one: no ``messages``, an empty
    list, or a last user turn without content.

    Raises DataError naming the file and line when the turns do not end with the user's.
    """
    name = dataset or prompt_file_stem(path)
    for lineno, rec in iter_jsonl(path):
        messages = rec.get("messages")
        where = f"{path}:{lineno}"
        if messages is None and isinstance(rec.get("prompt"), str) and "task_id" in rec:
            messages = [{"role": "user", "content": rec["prompt"]}]  # HumanEval's shape
            rec = {"id": rec["task_id"], **rec}
        if not isinstance(messages, list) or not messages:
            yield NoPrompt(where, "no prompt: expected a non-empty list of {role, content} "
                                  "turns in field 'messages'")
            continue
        last = messages[-1]
        if isinstance(last, dict) and last.get("role") == "user" and not last.get("content"):
            yield NoPrompt(where, "no prompt: the last user turn has no content")
            continue
        if not isinstance(last, dict) or last.get("role") != "user":
            raise DataError("the last turn must be the user's (the evaluator answers it)",
                            path=path, line=lineno, field="messages")
        yield Prompt(str(rec.get("id", f"{name}-{lineno}")), name,
                     tuple(render_ids(tokenizer, messages)))


SKIPPED_LISTED = 20
"""The report lists at most this many skipped records (all are counted)."""


def select(sources: list[tuple[str, Iterable[Prompt | NoPrompt | None]]], *, per_dataset: int | None,
           max_tokens: int, training: set[bytes]) -> PromptSelection:
    """Take prompts from each source in order: at most `per_dataset` per dataset, none longer
    than `max_tokens`, none whose hash is in `training`."""
    chosen: list[Prompt] = []
    taken: dict[str, int] = {}
    sel = PromptSelection(chosen, sources=[name for name, _ in sources])
    for _, items in sources:
        for p in items:
            if p is None or isinstance(p, NoPrompt):
                sel.left_out_empty += 1
                if p is not None:
                    sel.skipped.append(f"{p.where}: {p.why}")
                continue
            if per_dataset is not None and taken.get(p.dataset, 0) >= per_dataset:
                continue
            if len(p.ids) > max_tokens:
                sel.left_out_long += 1
                continue
            if _key(p.ids) in training:
                sel.left_out_training += 1
                continue
            taken[p.dataset] = taken.get(p.dataset, 0) + 1
            chosen.append(p)
    return sel

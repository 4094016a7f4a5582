"""Demo datasets: deterministic, in the documented formats, eval prompts held out."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.io import iter_jsonl
from eyas.manifest import verify_manifest
from eyas.tiny.demo_data import COUNTS, write_demo_datasets
from eyas.tiny.qa import split_qa, training_messages

ROLES = {"system", "user", "assistant", "tool"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict[str, Path]:
    return write_demo_datasets(tmp_path_factory.mktemp("demo"))


def records(path: Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def test_deterministic_and_manifested(demo, tmp_path):
    again = write_demo_datasets(tmp_path)
    assert sorted(again) == sorted(demo) == sorted(COUNTS)
    for name, path in demo.items():
        assert again[name].read_bytes() == path.read_bytes(), name
    assert verify_manifest(tmp_path) == []


def test_counts_and_unique_ids(demo):
    for name, path in demo.items():
        recs = records(path)
        assert len(recs) == COUNTS[name], name
        ids = [r["id"] for r in recs]
        assert len(set(ids)) == len(ids), name


def check_messages(messages: list[dict], *, ends_with: str) -> None:
    assert messages, "empty conversation"
    assert all(m["role"] in ROLES and isinstance(m["content"], str) for m in messages)
    assert all(m["content"].strip() for m in messages)
    assert messages[-1]["role"] == ends_with
    roles = [m["role"] for m in messages if m["role"] != "system"]
    assert roles[0] == "user"
    assert all(a != b for a, b in zip(roles[:-1], roles[1:], strict=True)), (
        f"roles do not alternate: {roles}"
    )


def test_chat_prompts_end_with_user_and_vary_in_shape(demo):
    recs = records(demo["demo_chat"])
    for r in recs:
        check_messages(r["messages"], ends_with="user")
    with_system = sum(r["messages"][0]["role"] == "system" for r in recs)
    multi_turn = sum(any(m["role"] == "assistant" for m in r["messages"]) for r in recs)
    assert 30 <= with_system <= 150
    assert 10 <= multi_turn <= 100


def test_sharegpt_form(demo):
    for r in records(demo["demo_sharegpt"]):
        conv = r["conversations"]
        assert set(r) == {"id", "conversations"}
        assert all(set(t) == {"from", "value"} for t in conv)
        assert all(t["from"] in {"system", "human", "gpt"} for t in conv)
        assert conv[-1]["from"] == "gpt"


def test_long_conversations_are_long_outliers(demo):
    long_recs = records(demo["demo_long"])
    chat_recs = records(demo["demo_chat"])
    for r in long_recs:
        check_messages(r["messages"], ends_with="assistant")
        assert sum(len(m["content"]) for m in r["messages"]) >= 4000, r["id"]
    long_chars = sum(len(m["content"]) for r in long_recs for m in r["messages"])
    chat_chars = sum(len(m["content"]) for r in chat_recs for m in r["messages"])
    assert long_chars > chat_chars  # 10% of the samples, most of the text


def test_reasoning_turns_carry_reasoning_content(demo):
    for r in records(demo["demo_reasoning"]):
        check_messages(r["messages"], ends_with="assistant")
        assistant = [m for m in r["messages"] if m["role"] == "assistant"]
        assert all(m["reasoning_content"].strip() for m in assistant)


def test_eval_prompts_are_never_training_prompts(demo):
    train, _ = split_qa()
    trained_prompts = {
        m["content"] for qa in train for m in training_messages(qa) if m["role"] == "user"
    }
    recs = records(demo["eval_prompts"])
    for r in recs:
        check_messages(r["messages"], ends_with="user")
        assert r["messages"][-1]["content"] not in trained_prompts
    trained_names = {qa.name for qa in train}
    for r in recs:
        name = r["messages"][-1]["content"].split("`")[1]
        assert name not in trained_names, name

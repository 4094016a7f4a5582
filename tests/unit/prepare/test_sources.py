"""Reading registry datasets: every container, every record shape, every error named."""

from __future__ import annotations

import json

import pytest

from eyas.config import DatasetConfig, FieldMap
from eyas.conversation import Conversation
from eyas.errors import DataError
from eyas.prepare.sources import TokenizedRecord, iter_records, read_records

OPENAI = {
    "id": "a1",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greeting."},
    ],
}
SPECFORGE = {
    "id": "b1",
    "conversations": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
}
SHAREGPT = {
    "conversations": [
        {"from": "system", "value": "S"},
        {"from": "human", "value": "Q"},
        {"from": "gpt", "value": "A"},
    ]
}
TOKENIZED = {"id": "t1", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}


def _ds(**kw) -> DatasetConfig:
    kw.setdefault("regenerate", False)
    return DatasetConfig(name="ds", source="x", **kw)


def _jsonl(path, objs) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")


def test_jsonl_auto_detects_each_shape(tmp_path):
    p = tmp_path / "d.jsonl"
    _jsonl(p, [OPENAI, SPECFORGE, SHAREGPT, TOKENIZED])
    recs = read_records(_ds(), p)
    a, b, c, t = recs
    assert isinstance(a, Conversation) and a.id == "a1"
    assert [m.role for m in a.messages] == ["system", "user", "assistant"]
    assert a.messages[2].reasoning_content == "Greeting."
    assert a.meta == {"path": str(p), "line": 1}
    assert [(m.role, m.content) for m in b.messages] == [("user", "Q"), ("assistant", "A")]
    assert c.id == "ds-3"  # no id field: <name>-<line>
    assert [(m.role, m.content) for m in c.messages] == [
        ("system", "S"),
        ("user", "Q"),
        ("assistant", "A"),
    ]
    assert isinstance(t, TokenizedRecord) and t.loss_mask == [0, 1, 1] and t.line == 4


def test_sharegpt_function_call_and_tools(tmp_path):
    rec = {
        "id": "g",
        "tools": json.dumps([{"name": "f", "parameters": {}}]),
        "conversations": [
            {"from": "human", "value": "call f"},
            {"from": "function_call", "value": json.dumps({"name": "f", "arguments": {"x": 1}})},
            {"from": "observation", "value": "42"},
            {"from": "gpt", "value": "It is 42."},
        ],
    }
    p = tmp_path / "d.jsonl"
    _jsonl(p, [rec])
    (conv,) = read_records(_ds(), p)
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    assert conv.messages[1].tool_calls[0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert conv.tools == [{"name": "f", "parameters": {}}]


def test_field_overrides(tmp_path):
    rec = {
        "uid": 9,
        "dialog": [
            {"speaker": "user", "text": "Q"},
            {"speaker": "assistant", "text": "A", "think": "R"},
        ],
    }
    p = tmp_path / "d.jsonl"
    _jsonl(p, [rec])
    fields = FieldMap(
        id="uid", messages="dialog", role="speaker", content="text", reasoning="think"
    )
    (conv,) = read_records(_ds(format="messages", fields=fields), p)
    assert conv.id == "9" and conv.messages[1].reasoning_content == "R"


def test_limit_and_text_parts(tmp_path):
    recs = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": "c"},
            ]
        }
        for _ in range(5)
    ]
    p = tmp_path / "d.jsonl"
    _jsonl(p, recs)
    out = read_records(_ds(limit=2), p)
    assert len(out) == 2 and out[0].messages[0].content == "ab"


def test_json_array_parquet_and_saved_dataset(tmp_path):
    import datasets

    rows = [OPENAI, dict(SPECFORGE, id="b2")]
    pj = tmp_path / "d.json"
    pj.write_text(json.dumps(rows), encoding="utf-8")
    assert [r.id for r in read_records(_ds(), pj)] == ["a1", "b2"]

    flat = [
        {
            "id": "p1",
            "conversations": [
                {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "A"},
            ],
        },
        {
            "id": "p2",
            "conversations": [
                {"role": "user", "content": "Q2"},
                {"role": "assistant", "content": "A2"},
            ],
        },
    ]
    hf = datasets.Dataset.from_list(flat)
    pq = tmp_path / "d.parquet"
    hf.to_parquet(str(pq))
    got = read_records(_ds(), pq)
    assert [(r.id, r.messages[1].content, r.meta["line"]) for r in got] == [
        ("p1", "A", 1),
        ("p2", "A2", 2),
    ]

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": hf, "test": hf.select([1])}).save_to_disk(str(saved))
    assert [r.id for r in read_records(_ds(split="test"), saved)] == ["p2"]
    with pytest.raises(DataError, match="split 'dev'"):
        read_records(_ds(split="dev"), saved)
    single = tmp_path / "single"
    datasets.Dataset.from_list([TOKENIZED]).save_to_disk(str(single))
    (t,) = read_records(_ds(), single)
    assert isinstance(t, TokenizedRecord) and t.input_ids == [1, 2, 3]


@pytest.mark.parametrize(
    "line, field, match",
    [
        ('{"messages": [', None, "malformed JSON"),
        ('{"messages": "hi"}', "messages", "expected a list of turns"),
        (
            '{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]}',
            "messages[0].content",
            "expected a string",
        ),
        ('{"messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role", "unknown role"),
        ('{"messages": []}', "messages", "empty conversation"),
        (
            '{"messages": [{"role": "user", "content": "q"}]}',
            "messages[0].role",
            "expected a final assistant",
        ),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}',
            "messages[1].content",
            "final assistant turn is empty",
        ),
        ('{"input_ids": [1, 2], "loss_mask": [1]}', "loss_mask", "equal lengths"),
        ('{"input_ids": [1, "x"], "loss_mask": [1, 1]}', "input_ids", "non-negative integer"),
        ('{"input_ids": [1, 2], "loss_mask": [1, 2]}', "loss_mask", "0 or 1"),
        ('{"text": "no turns"}', "messages", "no list of turns"),
    ],
)
def test_bad_records_name_file_line_and_field(tmp_path, line, field, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(OPENAI) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=match) as exc:
        read_records(_ds(), p)
    assert exc.value.path == str(p) and exc.value.line == 2 and exc.value.field == field


def test_regenerate_needs_only_a_user_turn(tmp_path):
    p = tmp_path / "prompts.jsonl"
    _jsonl(p, [{"messages": [{"role": "user", "content": "q"}]}])
    assert len(read_records(_ds(regenerate=True), p)) == 1
    _jsonl(p, [{"messages": [{"role": "system", "content": "s"}]}])
    with pytest.raises(DataError, match="no user turn"):
        read_records(_ds(regenerate=True), p)


def test_duplicate_ids_name_both_lines(tmp_path):
    p = tmp_path / "d.jsonl"
    _jsonl(p, [SPECFORGE, OPENAI, SPECFORGE])
    with pytest.raises(DataError, match="first seen on line 1") as exc:
        read_records(_ds(), p)
    assert exc.value.line == 3


def test_missing_empty_and_recordless_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_records(_ds(), tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match="empty"):
        read_records(_ds(), tmp_path / "e.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="no records"):
        read_records(_ds(), tmp_path / "blank.jsonl")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match="save_to_disk"):
        read_records(_ds(), tmp_path / "folder")


def test_on_error_yield_reports_and_continues(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(OPENAI) + "\n{bad\n" + json.dumps(SPECFORGE) + "\n", encoding="utf-8")
    items = list(iter_records(_ds(), p, on_error="yield"))
    assert isinstance(items[1], DataError) and items[1].line == 2
    assert [i.id for i in items if not isinstance(i, DataError)] == ["a1", "b1"]

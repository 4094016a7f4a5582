"""ShareGPT's packaged file as it comes: a JSON array cut off mid-record (`eyas.prepare.
sources`), on small truncated copies the tests make; conversations ending with a user turn."""

from __future__ import annotations

import json

import pytest
from support.loss_mask_fixtures import build_test_tokenizer

import eyas.prepare.sources as sources
from eyas.config import DatasetConfig, TokenizeConfig
from eyas.errors import DataError
from eyas.prepare.sources import CAPPED, TRIMMED, TRUNCATED, iter_records, read_records
from eyas.prepare.tokenize import tokenize_dataset


def _conv(i: int, *, end_with_user: bool = False) -> dict:
    turns = [{"from": "human", "value": f"Question {i}: café, naïve, 日本 🚀?"},
             {"from": "gpt", "value": f"Answer {i} — with “quotes” and \\n escapes."}]
    if end_with_user:
        turns.append({"from": "human", "value": "and then?"})
    return {"id": f"s{i}", "conversations": turns}


def _truncated_copy(path, n_complete: int, *, cut_in=25) -> int:
    """Write a ShareGPT-style array of `n_complete` records plus one cut `cut_in` bytes into
    its text (the array never closed), like the packaged file; return the broken record's
    byte offset."""
    head = "[\n  " + ",\n  ".join(json.dumps(_conv(i), ensure_ascii=False)
                                    for i in range(n_complete))
    head += ",\n  "
    broken = json.dumps(_conv(n_complete), ensure_ascii=False).encode()
    path.write_bytes(head.encode() + broken[:cut_in])
    return len(head.encode())


def _ds(**kw) -> DatasetConfig:
    kw.setdefault("regenerate", False)
    return DatasetConfig(name="sharegpt", source="x", format="sharegpt", **kw)


def test_truncated_array_is_a_clear_error_naming_file_offset_and_complete_records(tmp_path):
    path = tmp_path / "ShareGPT_cut.json"
    offset = _truncated_copy(path, 5)
    with pytest.raises(DataError) as info:
        read_records(_ds(), path)
    err = info.value
    assert err.path == str(path) and err.kind == TRUNCATED and err.line == 6
    assert f"byte {offset:,} of {path.stat().st_size:,}" in str(err)
    assert "5 complete records precede it" in str(err)
    assert "cut off" in str(err)


def test_with_the_reject_policy_the_complete_records_are_kept_and_the_cut_counted(tmp_path):
    path = tmp_path / "ShareGPT_cut.json"
    _truncated_copy(path, 5)
    items = list(iter_records(_ds(), path, on_error="yield"))
    assert [i.id for i in items[:5]] == [f"s{i}" for i in range(5)]
    assert isinstance(items[5], DataError) and items[5].kind == TRUNCATED
    assert items[0].messages[0].content == "Question 0: café, naïve, 日本 🚀?"

    out = tmp_path / "prepared"
    tok = build_test_tokenizer(tmp_path / "tok")
    cfg = TokenizeConfig(num_proc=1, on_bad_record="reject")
    stats = tokenize_dataset(iter_records(_ds(), path, on_error="yield"), out,
                             tokenizer_dir=tok, cfg=cfg, source_label=str(path))
    assert stats["samples"] == 5 and stats["rejected"] == 1
    assert stats["rejected_reasons"] == {TRUNCATED: 1}
    (reject,) = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert reject["kind"] == TRUNCATED and "5 complete records" in reject["error"]

    strict = TokenizeConfig(num_proc=1, on_bad_record="reject", max_rejected_share=0.1)
    with pytest.raises(DataError, match="max_rejected_share"):
        tokenize_dataset(iter_records(_ds(), path, on_error="yield"), tmp_path / "p2",
                         tokenizer_dir=tok, cfg=strict, source_label=str(path))


@pytest.mark.parametrize("chunk", [3, 7, 64])
def test_streamed_reading_across_chunk_boundaries_matches_a_whole_file_parse(tmp_path,
                                                                            monkeypatch, chunk):
    monkeypatch.setattr(sources, "JSON_CHUNK", chunk)
    records = [_conv(i) for i in range(6)] + [{"id": 7, "conversations": []}]
    path = tmp_path / "whole.json"
    path.write_text(" \n" + json.dumps(records, ensure_ascii=False, indent=1) + "\n",
                    encoding="utf-8")
    rows = list(sources.iter_rows(path))
    assert [obj for _, obj in rows] == records
    assert [row for row, _ in rows] == list(range(1, 8))
    cut = tmp_path / "cut.json"
    offset = _truncated_copy(cut, 4, cut_in=40)
    *good, (row, err) = list(sources.iter_rows(cut))
    assert len(good) == 4 and row == 5 and isinstance(err, DataError)
    assert f"byte {offset:,}" in str(err)


def test_malformed_json_inside_the_array_is_named_by_its_byte_offset(tmp_path):
    path = tmp_path / "bad.json"
    first = json.dumps(_conv(0))
    path.write_text(f"[{first}, {{\"id\": \"x\", oops}}, {first}]", encoding="utf-8")
    with pytest.raises(DataError, match=r"not valid JSON in the record starting at byte "
                                        rf"{len(first) + 3}") as info:
        read_records(_ds(), path)
    assert "1 complete records precede it" in str(info.value)
    path.write_text(f"[{first}] trailing", encoding="utf-8")
    with pytest.raises(DataError, match="text after the array's end"):
        read_records(_ds(), path)
    path.write_text('{"conversations": []}', encoding="utf-8")  # an object: read as JSONL
    with pytest.raises(DataError):
        read_records(_ds(), path)


def test_a_conversation_ending_with_a_user_turn_keeps_its_answered_turns(tmp_path):
    path = tmp_path / "ends.json"
    path.write_text(json.dumps([_conv(0), _conv(1, end_with_user=True)]), encoding="utf-8")
    first, second = read_records(_ds(), path)
    assert TRIMMED not in first.meta
    assert [m.role for m in second.messages] == ["user", "assistant"]
    assert second.meta[TRIMMED] == 1
    # Answers to regenerate: the user's last turn is what the target answers; nothing dropped.
    (_, again) = read_records(_ds(regenerate=True), path)
    assert [m.role for m in again.messages] == ["user", "assistant", "user"]
    # No answer at all still fails the record.
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}]}]))
    with pytest.raises(DataError, match="expected a final assistant"):
        read_records(_ds(), path)

    tok = build_test_tokenizer(tmp_path / "tok")
    path.write_text(json.dumps([_conv(0), _conv(1, end_with_user=True)]), encoding="utf-8")
    stats = tokenize_dataset(iter_records(_ds(), path), tmp_path / "out", tokenizer_dir=tok,
                             cfg=TokenizeConfig(num_proc=1))
    assert (stats["samples"], stats["trimmed_conversations"], stats["trimmed_turns"]) == (2, 1, 1)


def test_skip_and_limit_draw_disjoint_datasets_from_one_file(tmp_path):
    path = tmp_path / "cut.json"
    _truncated_copy(path, 6)
    first = read_records(_ds(limit=3), path)  # the cut lies beyond: never read
    rest = list(iter_records(_ds(skip=3), path, on_error="yield"))
    assert [r.id for r in first] == ["s0", "s1", "s2"]
    assert [r.id for r in rest[:3]] == ["s3", "s4", "s5"] and rest[3].kind == TRUNCATED
    with pytest.raises(DataError, match="6 complete records precede it"):
        read_records(_ds(skip=10), path)  # skipping past the cut still meets it


def _long_conv(i: int, users: int) -> dict:
    turns = []
    for u in range(users):
        turns += [{"from": "human", "value": f"Q{i}.{u}"}, {"from": "gpt", "value": f"A{i}.{u}"}]
    return {"id": f"m{i}", "conversations": turns}


def test_max_user_turns_keeps_the_first_turns_with_their_answers_and_counts_the_rest(tmp_path):
    path = tmp_path / "multi.json"
    path.write_text(json.dumps([_long_conv(0, 3), _long_conv(1, 1), _long_conv(2, 2)]))
    capped = read_records(_ds(max_user_turns=1), path)
    assert [[m.content for m in c.messages] for c in capped] == [
        ["Q0.0", "A0.0"], ["Q1.0", "A1.0"], ["Q2.0", "A2.0"]]
    assert [c.meta.get(CAPPED, 0) for c in capped] == [2, 0, 1]
    two = read_records(_ds(max_user_turns=2), path)
    assert [m.content for m in two[0].messages] == ["Q0.0", "A0.0", "Q0.1", "A0.1"]
    assert CAPPED not in two[2].meta
    # To regenerate: the first user turn alone is asked (its old answer is dropped later).
    (regen, *_) = read_records(_ds(max_user_turns=1, regenerate=True), path)
    assert [m.role for m in regen.messages] == ["user", "assistant"]
    # Unset, every turn stays.
    assert len(read_records(_ds(), path)[0].messages) == 6

    tok = build_test_tokenizer(tmp_path / "tok")
    stats = tokenize_dataset(iter_records(_ds(max_user_turns=1), path), tmp_path / "out",
                             tokenizer_dir=tok, cfg=TokenizeConfig(num_proc=1))
    assert (stats["samples"], stats["capped_conversations"], stats["capped_turns"]) == (3, 2, 3)
    # Without the cap the statistics keep the keys they always had.
    stats = tokenize_dataset(iter_records(_ds(), path), tmp_path / "out2", tokenizer_dir=tok,
                             cfg=TokenizeConfig(num_proc=1))
    assert "capped_conversations" not in stats

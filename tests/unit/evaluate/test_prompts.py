"""Held-out prompts: the merged eval split's prompts, rendered prompt files, per-dataset limits,
and training prompts left out."""

from __future__ import annotations

import json

import pytest

from eyas.errors import DataError
from eyas.evaluate.prompts import (
    file_prompts,
    merged_prompts,
    prompt_of_record,
    render_ids,
    select,
    training_prompt_keys,
)
from eyas.train.tiny_data import write_jsonl


def rec(i, ds, prompt, answer):
    return {"id": f"r{i}", "dataset": ds, "input_ids": prompt + answer,
            "loss_mask": [0] * len(prompt) + [1] * len(answer)}


def test_a_records_prompt_is_what_precedes_its_first_supervised_token():
    assert prompt_of_record([5, 6, 7, 8], [0, 0, 1, 1]) == [5, 6]
    assert prompt_of_record([5, 6, 7, 8], [0, 0, 1, 0]) == [5, 6]
    assert prompt_of_record([5, 6], [1, 1]) is None
    assert prompt_of_record([5, 6], [0, 0]) is None


def test_selection_limits_per_dataset_and_leaves_out_training_prompts(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [rec(0, "a", [1, 2, 3], [4]),
                                                    rec(1, "b", [9, 9], [4])])
    ev = write_jsonl(tmp_path / "eval.jsonl", [
        rec(10, "a", [1, 2, 3], [7]),     # a training prompt: left out
        rec(11, "a", [1, 2], [7]),
        rec(12, "b", [3, 3, 3, 3, 3], [7]),  # too long
        rec(13, "a", [4, 4], [7]),
        rec(14, "a", [5, 5], [7]),        # over the per-dataset limit
        {"id": "r15", "dataset": "b", "input_ids": [1, 2], "loss_mask": [1, 1]},
        rec(16, "b", [6], [7]),
    ])
    sel = select([("eval", merged_prompts(ev))], per_dataset=2, max_tokens=4,
                 training=training_prompt_keys(train))
    assert [(p.id, p.dataset, p.ids) for p in sel.prompts] == [
        ("r11", "a", (1, 2)), ("r13", "a", (4, 4)), ("r16", "b", (6,))]
    counts = sel.counts()
    assert counts["per_dataset"] == {"a": 2, "b": 1}
    assert (counts["left_out_training"], counts["left_out_long"], counts["left_out_empty"]) == (1, 1, 1)


def test_bad_eval_records_and_prompt_files_name_the_file_and_line(tmp_path):
    bad = write_jsonl(tmp_path / "eval.jsonl", [rec(0, "a", [1], [2]),
                                                 {"id": "x", "input_ids": [1, 2], "loss_mask": [0]}])
    with pytest.raises(DataError, match=r"eval.jsonl:2: field 'input_ids'"):
        list(merged_prompts(bad))
    pf = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}])
    with pytest.raises(DataError, match=r"p.jsonl:1: field 'messages'.*user"):
        list(file_prompts(pf, tokenizer=None))


def test_prompt_files_render_with_the_targets_chat_template(tmp_path, tiny_target):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    messages = [{"role": "user", "content": "What does `json.dumps` do?"}]
    pf = write_jsonl(tmp_path / "held_out.jsonl", [{"id": "q1", "messages": messages}])
    (p,) = list(file_prompts(pf, tok))
    assert p.dataset == "held_out" and p.id == "q1"
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.decode(list(p.ids)) == text
    assert list(p.ids) == render_ids(tok, messages)


def test_prompt_file_records_without_a_prompt_are_named_and_skipped(tmp_path, tiny_target):
    from transformers import AutoTokenizer

    from eyas.evaluate.prompts import select

    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    pf = write_jsonl(tmp_path / "mixed.jsonl", [
        {"id": "q1", "messages": [{"role": "user", "content": "What is a Counter?"}]},
        {"id": "no-messages", "prompt": "forgot the messages"},
        {"id": "empty", "messages": []},
        {"id": "blank", "messages": [{"role": "user", "content": ""}]},
        {"id": "q2", "messages": [{"role": "user", "content": "What is a deque?"}]}])
    sel = select([("mixed", file_prompts(pf, tok))], per_dataset=None, max_tokens=4096,
                 training=set())
    assert [p.id for p in sel.prompts] == ["q1", "q2"]
    counts = sel.counts()
    assert counts["left_out_empty"] == 3
    assert [x.split(": ")[0] for x in counts["skipped"]] == [f"{pf}:2", f"{pf}:3", f"{pf}:4"]
    assert "field 'messages'" in counts["skipped"][0] and "no content" in counts["skipped"][2]


def test_humaneval_gzip_prompt_file_renders_each_prompt_as_a_user_turn(tmp_path, tiny_target):
    import gzip

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    rows = [{"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n"},
            {"task_id": "HumanEval/1", "prompt": "def sub(a, b):\n"}]
    pf = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(pf, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    prompts = list(file_prompts(pf, tok))
    assert [(p.id, p.dataset) for p in prompts] == [("HumanEval/0", "HumanEval"),
                                                    ("HumanEval/1", "HumanEval")]
    messages = [{"role": "user", "content": rows[0]["prompt"]}]
    assert list(prompts[0].ids) == render_ids(tok, messages)

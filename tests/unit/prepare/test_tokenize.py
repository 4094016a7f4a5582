"""Phase 2 end to end: files, stats, manifest, rejects, validation, workers, interruption.

Every test runs twice: with a fast tokenizer, and with the Kimi-like tiktoken tokenizer (a
slow tokenizer whose class is loaded with ``trust_remote_code``, in the workers too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.loss_mask_fixtures import TEMPLATES, build_kimi_test_tokenizer, build_test_tokenizer
from transformers import AutoTokenizer

from eyas.config import DatasetConfig, TokenizeConfig
from eyas.conversation import Conversation, Message
from eyas.errors import DataError
from eyas.io import iter_jsonl, read_json
from eyas.manifest import verify_manifest
from eyas.prepare.loss_mask import tokenize_conversation
from eyas.prepare.sources import TokenizedRecord, iter_records
from eyas.prepare.tokenize import tokenize_dataset


@dataclass(frozen=True)
class TokCase:
    dir: Path
    trust: bool
    """Load with trust_remote_code."""
    end_of_turn: str
    template: str
    """A template to pass as an override (different text from the folder's own for "fast")."""

    def load(self):
        return AutoTokenizer.from_pretrained(self.dir, trust_remote_code=self.trust)


@pytest.fixture(scope="module", params=["fast", "kimi"])
def case(request, tmp_path_factory):
    if request.param == "fast":
        folder = build_test_tokenizer(tmp_path_factory.mktemp("tok"))
        return TokCase(folder, False, "<|end|>", TEMPLATES["qwen3"])
    folder = build_kimi_test_tokenizer(tmp_path_factory.mktemp("kimi"))
    return TokCase(folder, True, "<|im_end|>", TEMPLATES["kimi"])


@pytest.fixture(scope="module")
def tok_dir(case):
    return case.dir


def _convs(n: int) -> list[Conversation]:
    return [
        Conversation(
            f"c{i}",
            [
                Message("system", "Be brief."),
                Message("user", f"What is {i} + {i}?"),
                Message("assistant", f"It is {2 * i}.", reasoning_content=f"{i} + {i} = {2 * i}"),
            ],
        )
        for i in range(n)
    ]


def _lines(path):
    return [obj for _, obj in iter_jsonl(path)]


def test_writes_tokenized_stats_and_verifying_manifest(tmp_path, tok_dir, case):
    convs = _convs(7)
    out = tmp_path / "prepared"
    cfg = TokenizeConfig(num_proc=1, batch_size=3)
    stats = tokenize_dataset(
        convs,
        out,
        tokenizer_dir=tok_dir,
        trust_remote_code=case.trust,
        cfg=cfg,
        source_label="demo",
    )
    rows = _lines(out / "tokenized_data.jsonl")
    tok = case.load()
    for conv, row in zip(convs, rows, strict=True):
        ids, mask = tokenize_conversation(tok, conv)
        assert row == {"id": conv.id, "input_ids": ids, "loss_mask": mask}
    tokens = sum(len(r["input_ids"]) for r in rows)
    sup = sum(sum(r["loss_mask"]) for r in rows)
    assert stats == read_json(out / "stats.json")
    assert stats["samples"] == 7 and stats["tokens"] == tokens and stats["supervised_tokens"] == sup
    assert stats["max_len"] == max(len(r["input_ids"]) for r in rows)
    assert stats["supervised_fraction"] == pytest.approx(sup / tokens)
    assert stats["rejected"] == 0 and not (out / "rejects.jsonl").exists()
    assert verify_manifest(out) == []
    manifest = read_json(out / "manifest.json")
    assert set(manifest["outputs"]) == {"tokenized_data.jsonl", "stats.json"}
    assert manifest["config"]["end_of_turn"] == case.end_of_turn
    # the files that decide the ids are inputs: for Kimi's kind, the ranks and the class code
    names = {k.split("/", 1)[1] for k in manifest["inputs"] if k.startswith("tokenizer/")}
    if case.trust:
        assert {"tiktoken.model", "tokenization_kimi_like.py"} <= names
    # Corruption is detectable.
    with open(out / "tokenized_data.jsonl", "ab") as fh:
        fh.write(b"\n")
    assert verify_manifest(out)


def test_train_on_reasoning_off_and_template_override(tmp_path, tok_dir, case):
    convs = _convs(2)
    cfg = TokenizeConfig(num_proc=1, train_on_reasoning=False)
    tokenize_dataset(
        convs,
        tmp_path,
        tokenizer_dir=tok_dir,
        trust_remote_code=case.trust,
        cfg=cfg,
        chat_template=case.template,
    )
    tok = case.load()
    row = _lines(tmp_path / "tokenized_data.jsonl")[1]
    masked = tok.decode([t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m])
    assert masked == "It is 2.<|im_end|>"


def test_pretokenized_records_pass_through_and_ids_are_checked(tmp_path, tok_dir, case):
    rec = TokenizedRecord("t1", [1, 2, 3], [0, 1, 1], path="src.jsonl", line=4)
    stats = tokenize_dataset(
        [rec],
        tmp_path / "ok",
        tokenizer_dir=tok_dir,
        trust_remote_code=case.trust,
        cfg=TokenizeConfig(num_proc=1),
    )
    assert _lines(tmp_path / "ok" / "tokenized_data.jsonl") == [rec.to_json()]
    assert stats["supervised_tokens"] == 2
    vocab = len(case.load())
    bad = TokenizedRecord("t2", [1, vocab + 5], [0, 1], path="src.jsonl", line=9)
    with pytest.raises(DataError) as exc:
        tokenize_dataset(
            [rec, bad],
            tmp_path / "bad",
            tokenizer_dir=tok_dir,
            trust_remote_code=case.trust,
            cfg=TokenizeConfig(num_proc=1),
        )
    err = exc.value
    assert (err.path, err.line, err.field) == ("src.jsonl", 9, "input_ids")
    assert str(vocab + 5) in str(err) and f"size {vocab}" in str(err)
    # error mode: nothing that looks complete is left behind
    assert not (tmp_path / "bad" / "tokenized_data.jsonl").exists()
    assert not (tmp_path / "bad" / "manifest.json").exists()


def test_reject_mode_writes_rejects_and_counts(tmp_path, tok_dir, case):
    src = tmp_path / "src.jsonl"
    good = {
        "id": "g",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps(dict(good, id="h")),
        json.dumps({"id": "t", "input_ids": [1, 10**7], "loss_mask": [0, 1]}),
    ]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ds = DatasetConfig(name="d", source=str(src), regenerate=False)
    cfg = TokenizeConfig(num_proc=1, on_bad_record="reject")
    out = tmp_path / "out"
    stats = tokenize_dataset(
        iter_records(ds, src, on_error="yield"),
        out,
        tokenizer_dir=tok_dir,
        trust_remote_code=case.trust,
        cfg=cfg,
    )
    assert stats["samples"] == 2 and stats["rejected"] == 2
    assert [r["id"] for r in _lines(out / "tokenized_data.jsonl")] == ["g", "h"]
    rejects = _lines(out / "rejects.jsonl")
    assert [(r["line"], r["field"]) for r in rejects] == [(2, None), (4, "input_ids")]
    assert "malformed JSON" in rejects[0]["error"] and rejects[1]["record"]["id"] == "t"
    assert verify_manifest(out) == []
    assert "rejects.jsonl" in read_json(out / "manifest.json")["outputs"]


def test_error_mode_stops_at_first_bad_record(tmp_path, tok_dir, case):
    src = tmp_path / "src.jsonl"
    src.write_text(
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n{oops\n'
    )
    ds = DatasetConfig(name="d", source=str(src), regenerate=False)
    with pytest.raises(DataError, match="malformed JSON") as exc:
        tokenize_dataset(
            iter_records(ds, src),
            tmp_path / "o",
            tokenizer_dir=tok_dir,
            trust_remote_code=case.trust,
            cfg=TokenizeConfig(num_proc=1),
        )
    assert exc.value.line == 2
    assert not (tmp_path / "o" / "tokenized_data.jsonl").exists()


def test_all_rejected_is_an_error_but_keeps_rejects(tmp_path, tok_dir, case):
    conv = Conversation("only-user", [Message("user", "q")])
    cfg = TokenizeConfig(num_proc=1, on_bad_record="reject")
    with pytest.raises(DataError, match="no sample survived"):
        tokenize_dataset(
            [conv], tmp_path, tokenizer_dir=tok_dir, trust_remote_code=case.trust, cfg=cfg
        )
    assert len(_lines(tmp_path / "rejects.jsonl")) == 1
    assert not (tmp_path / "manifest.json").exists()


def test_interrupted_run_leaves_nothing_that_looks_complete(tmp_path, tok_dir, case):
    out = tmp_path / "out"
    cfg = TokenizeConfig(num_proc=1, batch_size=2)
    tokenize_dataset(_convs(3), out, tokenizer_dir=tok_dir, trust_remote_code=case.trust, cfg=cfg)
    assert verify_manifest(out) == []
    before = (out / "tokenized_data.jsonl").read_bytes()

    def dying():
        yield from _convs(5)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_dataset(dying(), out, tokenizer_dir=tok_dir, trust_remote_code=case.trust, cfg=cfg)
    assert verify_manifest(out)  # the old manifest is gone: the folder reads as partial
    assert (out / "tokenized_data.jsonl").read_bytes() == before  # old file untouched
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.slow
def test_worker_processes_give_the_same_output_in_input_order(tmp_path, tok_dir, case):
    convs = _convs(50)
    one = tmp_path / "one"
    two = tmp_path / "two"
    tokenize_dataset(
        convs,
        one,
        tokenizer_dir=tok_dir,
        trust_remote_code=case.trust,
        cfg=TokenizeConfig(num_proc=1, batch_size=4),
    )
    stats = tokenize_dataset(
        convs,
        two,
        tokenizer_dir=tok_dir,
        trust_remote_code=case.trust,
        cfg=TokenizeConfig(num_proc=2, batch_size=4),
    )
    assert stats["samples"] == 50
    assert (one / "tokenized_data.jsonl").read_bytes() == (
        two / "tokenized_data.jsonl"
    ).read_bytes()


def test_a_dataset_of_one_batch_starts_no_worker_process_and_two_batches_do(
        tmp_path, tok_dir, case, monkeypatch):
    """With ``num_proc: 2``, a dataset that fits one batch is tokenized in this process (a
    worker's start, importing the tokenizer, takes longer than the batch); one more record
    and the workers start. The files are the same either way."""
    import multiprocessing

    started = []
    real = multiprocessing.get_context

    def get_context(method=None):
        started.append(method)
        return real(method)

    monkeypatch.setattr(multiprocessing, "get_context", get_context)
    cfg = TokenizeConfig(num_proc=2, batch_size=4)
    inline = tokenize_dataset(_convs(4), tmp_path / "inline", tokenizer_dir=tok_dir,
                              trust_remote_code=case.trust, cfg=cfg)
    assert started == [] and inline["samples"] == 4
    pooled = tokenize_dataset(_convs(5), tmp_path / "pooled", tokenizer_dir=tok_dir,
                              trust_remote_code=case.trust, cfg=cfg)
    assert started == ["spawn"] and pooled["samples"] == 5
    first4 = (tmp_path / "pooled" / "tokenized_data.jsonl").read_bytes().splitlines()[:4]
    assert (tmp_path / "inline" / "tokenized_data.jsonl").read_bytes().splitlines() == first4


def _answers_with_cuts(n: int, cut: set[int]) -> list[Conversation]:
    """Phase 1's answers as read back from responses.jsonl: samples in `cut` were cut at
    max_tokens (finish_reason ``length``)."""
    return [
        Conversation.from_json({
            "id": f"a{i}",
            "conversations": [{"role": "user", "content": f"What is {i} + {i}?"},
                              {"role": "assistant", "content": f"It is {2 * i}"}],
            "finish_reasons": ["length" if i in cut else "stop"],
        })
        for i in range(n)
    ]


@pytest.mark.parametrize("num_proc", [1, 2])
def test_cut_answers_are_counted_and_handled_as_configured(tmp_path, tok_dir, case, num_proc):
    convs = _answers_with_cuts(8, cut={1, 4, 6})
    eot = case.load().convert_tokens_to_ids(case.end_of_turn)
    results = {}
    for policy in ("unsupervised_end", "drop", "keep"):
        out = tmp_path / policy
        cfg = TokenizeConfig(num_proc=num_proc, batch_size=3, cut_answers=policy)
        stats = tokenize_dataset(convs, out, tokenizer_dir=tok_dir, cfg=cfg,
                                 trust_remote_code=case.trust)
        assert stats == read_json(out / "stats.json")
        assert stats["cut_answers"] == 3
        results[policy] = (stats, {r["id"]: r for r in _lines(out / "tokenized_data.jsonl")})

    def closing_supervised(row) -> bool:
        last = len(row["input_ids"]) - 1 - row["input_ids"][::-1].index(eot)
        return bool(row["loss_mask"][last])

    stats, rows = results["unsupervised_end"]
    assert stats["samples"] == 8 and stats["cut_answers_dropped"] == 0
    assert [closing_supervised(rows[f"a{i}"]) for i in range(8)] == [i not in {1, 4, 6}
                                                                      for i in range(8)]
    stats, rows = results["drop"]
    assert stats["samples"] == 5 and stats["cut_answers_dropped"] == 3
    assert sorted(rows) == ["a0", "a2", "a3", "a5", "a7"]
    stats, rows = results["keep"]
    assert stats["samples"] == 8 and stats["cut_answers_dropped"] == 0
    assert all(closing_supervised(r) for r in rows.values())
    # Only the closing token differs between keeping and leaving the end unsupervised.
    unsupervised = results["unsupervised_end"][1]
    assert all(rows[k]["input_ids"] == unsupervised[k]["input_ids"] for k in rows)
    assert (results["keep"][0]["supervised_tokens"]
            - results["unsupervised_end"][0]["supervised_tokens"]) == 3


def test_only_cut_answers_and_drop_is_an_error_saying_so(tmp_path, tok_dir, case):
    cfg = TokenizeConfig(num_proc=1, cut_answers="drop")
    with pytest.raises(DataError, match="2 cut at max_tokens and dropped"):
        tokenize_dataset(_answers_with_cuts(2, cut={0, 1}), tmp_path, tokenizer_dir=tok_dir,
                         cfg=cfg, trust_remote_code=case.trust)


def test_a_cut_answer_with_nothing_left_to_train_is_left_out_and_counted(tmp_path, tok_dir, case):
    cut_in_thought = Conversation.from_json({
        "id": "t", "conversations": [{"role": "user", "content": "What is 6 * 7?"},
                                     {"role": "assistant", "content": "",
                                      "reasoning_content": "I think the answer is"}],
        "finish_reasons": ["length"]})
    cfg = TokenizeConfig(num_proc=1, train_on_reasoning=False)  # the reasoning is not trained
    stats = tokenize_dataset(_convs(2) + [cut_in_thought], tmp_path, tokenizer_dir=tok_dir,
                             cfg=cfg, trust_remote_code=case.trust)
    assert (stats["samples"], stats["cut_answers"], stats["cut_answers_dropped"]) == (2, 1, 1)
    assert stats["rejected"] == 0


def test_final_turn_reasoning_is_counted_trained_and_a_shortfall_warned(tmp_path, tok_dir, case,
                                                                         caplog):
    """Kimi's template drops every finished answer's reasoning: as its template renders it,
    none of the final thought is trained, and phase 2 says so; as generated (the default for
    its thinking generation prompt) all of it is."""
    convs = _convs(4)
    tok = case.load()
    thought = sum(len(tok(c.messages[-1].reasoning_content, add_special_tokens=False)
                      ["input_ids"]) for c in convs)
    runs = {}
    for mode in ("auto", "as_template"):
        caplog.clear()
        stats = tokenize_dataset(convs, tmp_path / mode, tokenizer_dir=tok_dir,
                                 cfg=TokenizeConfig(num_proc=1, final_turn=mode),
                                 trust_remote_code=case.trust, source_label=f"ds-{mode}")
        assert stats == read_json(tmp_path / mode / "stats.json")
        assert stats["final_reasoning_tokens"] == stats["reasoning_tokens"] == thought
        runs[mode] = (stats, [r.getMessage() for r in caplog.records if r.levelname == "WARNING"])
    stats, warnings = runs["auto"]
    assert stats["final_reasoning_supervised"] == thought and not warnings
    assert stats["final_reasoning_supervised_fraction"] == 1.0
    assert stats["reasoning_undertrained"] is False
    stats, warnings = runs["as_template"]
    if case.trust:  # Kimi: a thinking generation prompt, auto chose as_generated
        assert runs["auto"][0]["final_turn"] == "as_generated"
        assert stats["final_reasoning_supervised"] == 0 and stats["reasoning_undertrained"]
        assert len(warnings) == 1 and "ds-as_template" in warnings[0] and "0.0%" in warnings[0]
        # Exactly the reasoning tokens are what as_template leaves out of training.
        assert (runs["auto"][0]["supervised_tokens"] - stats["supervised_tokens"]) == thought
    else:  # the demo template renders every reasoning: both modes train all of it
        assert runs["auto"][0]["final_turn"] == "as_template"
        assert stats["final_reasoning_supervised"] == thought and not warnings
    # Reasoning deliberately not trained: counted, not warned about.
    caplog.clear()
    stats = tokenize_dataset(convs, tmp_path / "off", tokenizer_dir=tok_dir,
                             cfg=TokenizeConfig(num_proc=1, train_on_reasoning=False),
                             trust_remote_code=case.trust)
    assert stats["final_reasoning_supervised"] == 0 and not stats["reasoning_undertrained"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
# --------------------------------------------------------------------------- bad records


def _source(tmp_path, n_good: int, spelled: list[tuple[str, str]], *, broken: int = 0) -> Path:
    """A JSONL source: `n_good` clean conversations, one per (field, text) of `spelled` (an
    answer as a server without parsers returns it) and `broken` malformed lines."""
    def conv(i: int, **answer) -> str:
        return json.dumps({"id": f"s{i}", "messages": [
            {"role": "user", "content": f"What is {i} + {i}?"},
            {"role": "assistant", "content": f"It is {2 * i}.", **answer}]})

    lines = [conv(i) for i in range(n_good)]
    lines += [conv(n_good + k, **{field: text}) for k, (field, text) in enumerate(spelled)]
    lines += ["{not json"] * broken
    path = tmp_path / "src.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tokenize_source(src, out, case, cfg):
    ds = DatasetConfig(name="d", source=str(src), regenerate=False)
    on_error = "yield" if cfg.on_bad_record == "reject" else "raise"
    return tokenize_dataset(iter_records(ds, src, on_error=on_error), out, tokenizer_dir=case.dir,
                            trust_remote_code=case.trust, cfg=cfg, source_label=str(src))


def _server_without_parser(case) -> list[tuple[str, str]]:
    """What a server without reasoning / tool-call parsers puts in an answer's fields."""
    tool = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
            "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
            if case.trust else '<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    return [("content", "Let me add.</think>It is 4."), ("content", "Calling it." + tool),
            ("reasoning_content", "I think <think> twice")]


def test_answers_spelling_special_tokens_are_rejected_and_counted_per_reason(tmp_path, case):
    """Content like ``reasoning</think>answer`` or tool calls as text (a server without its
    parsers) is refused with the reason ``special-text``; rejects are counted per reason."""
    src = _source(tmp_path, 5, _server_without_parser(case), broken=1)
    out = tmp_path / "out"
    stats = _tokenize_source(src, out, case, TokenizeConfig(num_proc=1, on_bad_record="reject"))
    assert stats["samples"] == 5 and stats["rejected"] == 4
    assert stats["rejected_reasons"] == {"special-text": 3, "malformed JSON": 1}
    assert read_json(out / "stats.json")["rejected_reasons"] == stats["rejected_reasons"]
    rejects = _lines(out / "rejects.jsonl")
    assert [r["reason"] for r in rejects] == ["special-text"] * 3 + ["malformed JSON"]
    assert [r["field"] for r in rejects[:3]] == [
        "messages[1].content", "messages[1].content", "messages[1].reasoning_content"]
    assert "'</think>'" in rejects[0]["error"] and rejects[0]["record"]["id"] == "s5"
    assert [r["id"] for r in _lines(out / "tokenized_data.jsonl")] == [f"s{i}" for i in range(5)]


def test_error_mode_stops_at_an_answer_spelling_a_special_token_naming_the_flags(tmp_path, case):
    src = _source(tmp_path, 2, _server_without_parser(case)[:1])
    with pytest.raises(DataError, match=r"special token '</think>'") as info:
        _tokenize_source(src, tmp_path / "o", case, TokenizeConfig(num_proc=1))
    assert info.value.line == 3 and info.value.field == "messages[1].content"
    flags = "--reasoning-parser kimi_k2 --tool-call-parser kimi_k2"
    assert (flags in str(info.value)) == case.trust  # Kimi's markers name Kimi's parsers
    assert not (tmp_path / "o" / "tokenized_data.jsonl").exists()


@pytest.mark.parametrize("max_share", [0.35, 0.2])
def test_rejected_share_under_the_limit_passes_over_it_fails(tmp_path, case, max_share):
    """8 good, 3 spelled, 1 malformed: 4 of 12 rejected (33%)."""
    src = _source(tmp_path, 8, _server_without_parser(case), broken=1)
    out = tmp_path / "prepared" / "B1_glaive"
    cfg = TokenizeConfig(num_proc=1, on_bad_record="reject", max_rejected_share=max_share)
    if max_share > 4 / 12:
        stats = _tokenize_source(src, out, case, cfg)
        assert stats["samples"] == 8 and stats["rejected"] == 4
        assert verify_manifest(out) == []
        return
    with pytest.raises(DataError) as info:
        _tokenize_source(src, out, case, cfg)
    msg = str(info.value)
    assert "dataset 'B1_glaive'" in msg and "4 of 12 records rejected (33.33%)" in msg
    assert "tokenize.max_rejected_share (20.00%)" in msg
    assert "top reasons: special-text (3); malformed JSON (1)" in msg
    assert str(out / "rejects.jsonl") in msg
    assert len(_lines(out / "rejects.jsonl")) == 4  # kept, for the user to read
    assert not (out / "tokenized_data.jsonl").exists() and not (out / "manifest.json").exists()


def test_max_rejected_share_is_a_share():
    with pytest.raises(ValueError, match="max_rejected_share"):
        TokenizeConfig(max_rejected_share=1.5)
    with pytest.raises(ValueError, match="max_rejected_share"):
        TokenizeConfig(max_rejected_share=-0.1)
    assert TokenizeConfig().max_rejected_share == 1.0


def test_two_datasets_tokenized_at_once_in_one_process_keep_their_own_settings(tok_dir, case):
    """A flow tokenizes its datasets at once, in threads of one process; tokenizing in that
    process (one batch, or ``num_proc: 1``), each call keeps its tokenizer and settings to
    itself. Here two calls interleave batch by batch, one training the reasoning and one
    not: each gives what it gives alone."""
    from eyas.prepare.tokenize import _run_batches

    cfg = TokenizeConfig(num_proc=1, batch_size=2)

    def outcomes(reasoning: bool):
        init = (str(tok_dir), case.trust, None, reasoning)
        return _run_batches(_convs(4), cfg=cfg, init_args=init)

    alone = {r: list(outcomes(r)) for r in (True, False)}
    assert alone[True] != alone[False]
    with_, without = outcomes(True), outcomes(False)
    interleaved = {True: [], False: []}
    for _ in range(4):
        interleaved[True].append(next(with_))
        interleaved[False].append(next(without))
    assert interleaved == alone

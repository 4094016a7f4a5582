from eyas.prepare.report import (
    composition_picture,
    cut_answer_lines,
    dataset_rows,
    markdown_summary,
    reasoning_lines,
)

TOKENIZED = {
    "chat": {"samples": 90, "tokens": 9000, "mean_len": 100.0, "max_len": 300, "supervised_fraction": 0.5,
             "cut_answers": 7, "cut_answers_dropped": 0},
    "long": {"samples": 10, "tokens": 11000, "mean_len": 1100.0, "max_len": 4000, "supervised_fraction": 0.7},
}
MERGE = {
    "records": 95, "tokens": 15000, "supervised_tokens": 9000, "train": {"records": 90}, "eval": {"records": 5},
    "truncated": 4, "dropped_unsupervised": 1, "max_seq_len": 1024, "seed": 42,
    "excluded": {}, "outliers": [{"dataset": "long", "reasons": ["token share 55% is 5.5x its sample share 10%"],
                                  "excluded": False}],
}


def test_rows_shares_and_flags():
    rows = {r["dataset"]: r for r in dataset_rows(TOKENIZED, MERGE)}
    assert rows["chat"]["sample_share"] == 0.9 and rows["long"]["token_share"] == 0.55
    assert rows["long"]["outlier"] == "yes" and rows["chat"]["outlier"] == ""


def test_markdown_names_the_outlier_and_the_remedy():
    md = markdown_summary("demo", dataset_rows(TOKENIZED, MERGE), MERGE)
    assert "outlier long" in md and "merge.exclude" in md
    assert "| records | 95 |" in md and "samples  90.0%" in md


def test_picture_is_a_png(tmp_path):
    path = composition_picture(dataset_rows(TOKENIZED, MERGE), tmp_path / "c.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_answers_cut_at_max_tokens_per_dataset_in_rows_and_summary():
    rows = {r["dataset"]: r for r in dataset_rows(TOKENIZED, MERGE)}
    assert rows["chat"]["cut_answers"] == 7 and rows["long"]["cut_answers"] == 0
    lines = cut_answer_lines(TOKENIZED, "unsupervised_end")
    assert lines == ["chat: 7 of 90 samples (7.8%) hold an answer cut at max_tokens — kept, "
                     "closing end-of-turn unsupervised"]
    md = markdown_summary("demo", dataset_rows(TOKENIZED, MERGE), MERGE, lines)
    assert "Answers cut at `generation.max_tokens`" in md and lines[0] in md
    dropped = {"chat": {**TOKENIZED["chat"], "samples": 83, "cut_answers_dropped": 7}}
    assert cut_answer_lines(dropped, "drop") == [
        "chat: 7 of 90 samples (7.8%) hold an answer cut at max_tokens — dropped"]
    assert "Answers cut" not in markdown_summary("demo", dataset_rows(TOKENIZED, MERGE), MERGE)


def test_final_turn_reasoning_per_dataset_in_rows_and_summary():
    tokenized = {
        "think": {**TOKENIZED["chat"], "final_turn": "as_template", "final_reasoning_tokens": 5000,
                  "final_reasoning_supervised": 0, "final_reasoning_supervised_fraction": 0.0,
                  "reasoning_undertrained": True},
        "ok": {**TOKENIZED["long"], "final_turn": "as_generated", "final_reasoning_tokens": 800,
               "final_reasoning_supervised": 800, "final_reasoning_supervised_fraction": 1.0,
               "reasoning_undertrained": False},
        "plain": TOKENIZED["long"],
    }
    rows = {r["dataset"]: r for r in dataset_rows(tokenized, None)}
    assert (rows["think"]["final_reasoning_tokens"], rows["think"]["final_reasoning_supervised"]) == (
        5000, 0.0)
    assert rows["ok"]["final_reasoning_supervised"] == 1.0
    assert rows["plain"]["final_reasoning_supervised"] == ""
    lines = reasoning_lines(tokenized)
    assert lines == [
        "**UNDER 90%** think: 0 of 5,000 final-turn reasoning tokens supervised (0.0%; "
        "tokenize.final_turn as_template) — the drafter will not learn the target's thinking",
        "ok: 800 of 800 final-turn reasoning tokens supervised (100.0%; tokenize.final_turn "
        "as_generated)",
    ]
    md = markdown_summary("demo", list(rows.values()), None, None, lines)
    assert "Reasoning of the final turns" in md and lines[0] in md
def test_cut_share_and_rejects_per_reason_in_the_table():
    """The statistics table carries each dataset's cut-answer share and its rejects by reason
    (from stats.json; older stats without ``cut_answer_share`` get it computed)."""
    tokenized = {
        **TOKENIZED,
        "kimi": {"samples": 96, "tokens": 9600, "cut_answers": 12, "cut_answer_share": 0.125,
                 "rejected": 4, "rejected_reasons": {"special-text": 3, "malformed JSON": 1}},
    }
    rows = {r["dataset"]: r for r in dataset_rows(tokenized, None)}
    assert rows["kimi"]["cut_share"] == 0.125
    assert rows["chat"]["cut_share"] == round(7 / 90, 4) and rows["long"]["cut_share"] == 0.0
    assert rows["kimi"]["rejected"] == 4
    assert rows["kimi"]["reject_reasons"] == "special-text (3); malformed JSON (1)"
    assert rows["chat"]["rejected"] == 0 and rows["chat"]["reject_reasons"] == ""

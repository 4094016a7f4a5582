"""The run's picture, table and summary speak of τ as ``eyas.train.metrics`` defines it."""

from __future__ import annotations

import pytest

from eyas.train.metrics import summarise
from eyas.train.report import evaluation_rows, summary_markdown, tau_text, training_picture


def record(kind: str, step: int, acc: list[float]) -> dict:
    import torch

    m = summarise(torch.tensor([round(a * 100) for a in acc]), torch.tensor([100] * len(acc)))
    return {"kind": kind, "step": step, "loss": 3.0, **m, "tokens": 10}


def test_the_table_gives_tau_for_three_steps_and_the_trained_unroll():
    best = record("eval", 8, [0.5] * 7)
    rows = evaluation_rows(best)
    assert [r["draft_step"] for r in rows] == [*map(str, range(7)),
                                               "simulated acceptance length, 3 draft steps",
                                               "simulated acceptance length"]
    assert rows[-2]["all_accepted_through_step"] == 1.875
    assert rows[-1]["all_accepted_through_step"] == round(1 + sum(0.5**i for i in range(1, 8)), 4)
    assert tau_text(best) == "τ 1.992 (7 draft steps), 1.875 (3)"


def test_summary_and_picture_read_old_histories_with_the_same_definition(tmp_path):
    old = {"kind": "eval", "step": 4, "loss": 2.0, "acc": [0.5, 0.5, 0.5],
           "simulated_acceptance_length": 0.875, "tokens": 10}  # before the bonus token
    md = summary_markdown({"steps": 4, "export": "x"}, [old])
    assert "τ 1.875 (3 draft steps)" in md and "bonus token counted" in md
    png = training_picture([record("train", 2, [0.4] * 3), old], tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no training or evaluation record"):
        training_picture([], tmp_path / "q.png")

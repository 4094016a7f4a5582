"""Rows and verdict of the serving benchmark: best EAGLE-3 setting per batch size against the
baseline, wins, ties and losses in one sentence."""

from __future__ import annotations

import pytest

from eyas.evaluate.serving_config import SpecKnobs
from eyas.evaluate.serving_verdict import ROW_KEYS, compare, make_row, verdict


def _rows(base: dict[int, float], spec: dict[tuple[int, SpecKnobs], float]) -> list[dict]:
    rows = [make_row("baseline", b, None, v, None) for b, v in base.items()]
    rows += [make_row("eagle3", b, k, v, 2.5) for (b, k), v in spec.items()]
    return rows


A, B = SpecKnobs(3, 1, 4), SpecKnobs(5, 1, 6)


def test_row_shape_is_the_one_reports_draw():
    row = make_row("eagle3", 8, A, 123.0, 2.9)
    assert tuple(row) == ROW_KEYS
    assert row == {"mode": "eagle3", "batch_size": 8, "num_steps": 3, "eagle_topk": 1,
                   "num_draft_tokens": 4, "output_tok_s": 123.0, "accept_length": 2.9}
    with pytest.raises(ValueError):
        make_row("baseline", 1, A, 1.0, None)
    with pytest.raises(ValueError):
        make_row("eagle3", 1, None, 1.0, None)


def test_best_setting_per_batch_size_against_the_baseline():
    rows = _rows({1: 90.0, 8: 600.0, 32: 1500.0},
                 {(1, A): 180.0, (1, B): 207.0, (8, A): 700.0, (8, B): 650.0,
                  (32, A): 1200.0, (32, B): 1100.0})
    comps = compare(rows)
    assert [(c.batch_size, c.num_steps, c.outcome) for c in comps] == [
        (1, 5, "beats"), (8, 3, "beats"), (32, 3, "loses")]
    assert comps[0].speedup == pytest.approx(2.3)
    assert verdict(rows) == ("EAGLE-3 beats the baseline at batch 1 by 2.30x and batch 8 by "
                             "1.17x, loses at batch 32 (0.80x).")


def test_every_batch_size_won():
    rows = _rows({1: 100.0, 8: 100.0}, {(1, A): 150.0, (8, A): 120.0})
    assert verdict(rows) == ("EAGLE-3 beats the baseline at every batch size measured: "
                             "1.50x at batch 1 and 1.20x at batch 8.")


def test_no_win_says_so_with_ties_and_losses():
    rows = _rows({1: 90.0, 8: 100.0, 32: 100.0}, {(1, A): 88.0, (8, A): 101.0, (32, A): 50.0})
    assert verdict(rows) == ("EAGLE-3 does not beat the baseline at any batch size: it ties at "
                             "batch 1 (0.98x) and batch 8 (1.01x), loses at batch 32 (0.50x).")
    assert verdict(rows, tie_band=0.0).startswith("EAGLE-3 beats the baseline at batch 8 by 1.01x")


def test_equal_throughput_prefers_the_cheaper_setting_and_unpaired_sizes_are_ignored():
    rows = _rows({1: 100.0, 4: 100.0}, {(1, B): 150.0, (1, A): 150.0, (16, A): 999.0})
    (only,) = compare(rows)
    assert (only.batch_size, only.num_draft_tokens) == (1, 4)
    assert verdict(_rows({1: 1.0}, {(8, A): 2.0})).startswith("No verdict")

"""Rows and verdict of the serving benchmark: best EAGLE-3 setting per batch size against the
baseline, wins, ties and losses in one sentence."""

from __future__ import annotations

import pytest

from eyas.evaluate.serving_config import SpecKnobs
from eyas.evaluate.serving_verdict import ROW_KEYS, compare, make_row, measured_costs, verdict


def _rows(base: dict[int, float], spec: dict[tuple[int, SpecKnobs], float]) -> list[dict]:
    rows = [make_row("baseline", b, None, v, None) for b, v in base.items()]
    rows += [make_row("eagle3", b, k, v, 2.5) for (b, k), v in spec.items()]
    return rows


A, B = SpecKnobs(3, 1, 4), SpecKnobs(5, 1, 6)


def test_row_shape_is_the_one_reports_draw():
    row = make_row("eagle3", 8, A, 123.0, 2.9)
    assert tuple(row) == ROW_KEYS
    assert row == {"mode": "eagle3", "batch_size": 8, "num_steps": 3, "eagle_topk": 1,
                   "num_draft_tokens": 4, "output_tok_s": 123.0, "accept_length": 2.9,
                   "output_tok_s_min": 123.0, "output_tok_s_max": 123.0, "decode_tok_s": None,
                   "decode_tok_s_min": None, "decode_tok_s_max": None, "ttft_s": None,
                   "repeats": 1}
    with pytest.raises(ValueError):
        make_row("baseline", 1, A, 1.0, None)
    with pytest.raises(ValueError):
        make_row("eagle3", 1, None, 1.0, None)
    with pytest.raises(ValueError):
        make_row("ngram", 1, A, 1.0, None)


def test_a_row_of_repeated_runs_has_their_median_and_spread():
    row = make_row("ngram", 1, None, [100.0, 90.0, 120.0], 1.4, decode_tok_s=[88.0, 91.0, 89.0],
                   ttft_s=[0.5, 0.2, 0.3])
    assert (row["output_tok_s"], row["output_tok_s_min"], row["output_tok_s_max"]) == (
        100.0, 90.0, 120.0)
    assert (row["decode_tok_s"], row["decode_tok_s_min"], row["decode_tok_s_max"]) == (
        89.0, 88.0, 91.0)
    assert (row["ttft_s"], row["repeats"], row["num_steps"]) == (0.3, 3, None)


def _spread(mode, b, knobs, runs, decode=()):
    return make_row(mode, b, knobs, runs, 2.5 if knobs else None, decode_tok_s=decode)


def test_batch_1_compares_a_requests_decode_speed_not_the_throughput():
    """Users quote one request's decode tokens/s at batch 1 (prefill excluded): the verdict
    compares that where both rows have it, the throughput elsewhere."""
    rows = [_spread("baseline", 1, None, [80.0], [90.0]),
            _spread("eagle3", 1, A, [120.0], [200.0]),
            _spread("baseline", 8, None, [600.0], [80.0]),
            _spread("eagle3", 8, A, [500.0], [150.0])]
    c1, c8 = compare(rows)
    assert (c1.metric, c1.speedup) == ("decode_tok_s", pytest.approx(200 / 90))
    assert (c8.metric, c8.outcome) == ("output_tok_s", "loses")


def test_overlapping_runs_are_within_noise_and_apart_runs_decide():
    """Three runs each: a call (faster / same / slower) only where the spread allows it."""
    base = _spread("baseline", 1, None, [95.0, 100.0, 105.0])
    noisy = _spread("eagle3", 1, A, [98.0, 110.0, 125.0])     # median 1.10x, ranges overlap
    apart = _spread("eagle3", 1, A, [106.0, 107.0, 108.0])    # 1.07x, ranges apart
    tight = _spread("eagle3", 1, A, [100.0, 100.5, 101.0])    # overlap, every ratio near 1
    assert compare([base, noisy])[0].outcome == "within noise"
    assert compare([base, apart])[0].outcome == "beats"
    assert compare([_spread("baseline", 1, None, [99.0, 100.0, 101.0]), tight])[0].outcome \
        == "ties"
    assert compare([base, noisy])[0].baseline_range == (95.0, 105.0)
    assert verdict([base, noisy]) == ("EAGLE-3 does not beat the baseline at any batch size: it "
                                      "is within noise at batch 1 (1.10x).")
    # Before: the medians alone said "beats ... by 1.10x".
    assert "beats" not in verdict([base, noisy])


def test_the_ngram_server_gets_a_sentence_of_its_own():
    rows = [_spread("baseline", 1, None, [100.0]), _spread("ngram", 1, None, [130.0]),
            _spread("eagle3", 1, A, [200.0])]
    assert verdict(rows) == (
        "EAGLE-3 beats the baseline at every batch size measured: 2.00x at batch 1. "
        "EAGLE-3 beats SGLang's n-gram speculation at every batch size measured: 1.54x at "
        "batch 1.")
    (c,) = compare(rows, reference="ngram")
    assert (c.reference, c.baseline_tok_s) == ("ngram", 130.0)
    assert [c.reference for c in compare(rows)] == ["baseline"]


def test_draft_and_verification_costs_from_the_batch_1_rows():
    """cycle = 1000 * accept / decode tok/s = k * draft + verify: fitted over two chain
    lengths; with one, the n-gram server's cycle stands for the verification."""
    def row(mode, knobs, decode, accept):
        return make_row(mode, 1, knobs, [1.0], accept, decode_tok_s=[decode])

    # draft 2 ms, verify 12 ms, target step 10 ms (100 tok/s); tau 3 at k=3, 3.5 at k=5.
    rows = [row("baseline", None, 100.0, None),
            row("eagle3", SpecKnobs(3, 1, 4), 1000 * 3 / 18, 3.0),
            row("eagle3", SpecKnobs(5, 1, 6), 1000 * 3.5 / 22, 3.5)]
    costs = measured_costs(rows)
    assert costs["target_step_ms"] == pytest.approx(10.0)
    assert costs["draft_step_ms"] == pytest.approx(2.0)
    assert costs["verify_ms"] == pytest.approx(12.0)
    assert costs["draft_to_target"] == pytest.approx(0.2)
    assert costs["method"].startswith("fit")
    one = [rows[0], rows[1], row("ngram", None, 1000 * 1.3 / 13, 1.3)]
    costs = measured_costs(one)
    assert costs["verify_ms"] == pytest.approx(13.0)
    assert costs["draft_step_ms"] == pytest.approx(5 / 3)
    assert measured_costs(one[:2])["verify_ms"] == pytest.approx(10.0)
    assert measured_costs([make_row("baseline", 1, None, [1.0], None)]) is None


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

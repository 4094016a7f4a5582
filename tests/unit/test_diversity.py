"""distinct-n and repeat rate: worked examples written out by hand."""

from __future__ import annotations

import pytest

from eyas.diversity import answer_diversity, distinct_n, repeat_rate


def test_distinct_2_counts_bigrams_across_all_answers():
    # bigrams: (a b) (b c) | (a b) (b d) -> 3 unique of 4
    assert distinct_n(["a b c", "a  b d"], 2) == pytest.approx(3 / 4)
    assert distinct_n(["one two three four"], 2) == 1.0
    assert distinct_n(["x"], 2) == 0.0
    assert distinct_n([], 2) == 0.0
    assert distinct_n(["a a a a"], 1) == pytest.approx(1 / 4)
    with pytest.raises(ValueError):
        distinct_n(["a b"], 0)


def test_repeat_rate_is_the_share_of_copies():
    assert repeat_rate(["a", "b", "c"]) == 0.0
    assert repeat_rate(["same", "same", "same", "other"]) == pytest.approx(2 / 4)
    assert repeat_rate(["x  y", "x y\n"]) == pytest.approx(1 / 2)  # whitespace collapsed
    assert repeat_rate([]) == 0.0


def test_a_model_that_says_one_sentence_scores_low():
    degenerate = ["Return the current file."] * 9 + ["Return the path."]
    stats = answer_diversity(degenerate)
    assert stats["repeat_rate"] == pytest.approx(0.8)
    assert stats["top_answer"] == "Return the current file."
    assert stats["top_answer_share"] == pytest.approx(0.9)
    assert stats["distinct_2"] < 0.2
    assert stats["answers"] == 10 and stats["mean_words"] == pytest.approx(3.9)
    assert answer_diversity([])["answers"] == 0

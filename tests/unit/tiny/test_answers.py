"""The cached tiny target answers the demo prompts in varied, on-topic text that ends.

The thresholds separate a target worth drafting for from the first tiny target (300 steps on
one Q&A form), which answered most prompts with "Return the file-like object." and scored, on
these prompts: distinct-2 0.03, repeat rate 0.54, on-topic 0.00.
"""

from __future__ import annotations

import pytest

from eyas.tiny.answers import PROBE_CHAT, PROBE_EVAL, answer_stats, asked_name
from eyas.tiny.build import read_build_info


def test_asked_name_is_the_first_backticked_name_of_the_last_turn():
    conv = [{"role": "user", "content": "Explain `a.b`."}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": "What does `json.dumps` do with `obj`?"}]
    assert asked_name(conv) == "json.dumps"
    assert asked_name([{"role": "user", "content": "Hi"}]) == ""


@pytest.mark.slow
def test_demo_answers_are_varied_on_topic_and_end(tiny_target):
    stats = answer_stats(tiny_target)
    assert stats["answers"] == PROBE_EVAL + PROBE_CHAT
    assert stats["distinct_2"] >= 0.30, stats
    assert stats["repeat_rate"] <= 0.10, stats
    assert stats["top_answer_share"] <= 0.05, stats
    assert stats["on_topic_share"] >= 0.40, stats
    assert stats["ended_share"] >= 0.75, stats
    # The build's record was measured the same way when the weights were trained; greedy
    # decoding is deterministic up to CPU kernel rounding, so the figures agree closely.
    recorded = read_build_info(tiny_target)["answers"]
    for key in ("distinct_2", "repeat_rate", "on_topic_share"):
        assert stats[key] == pytest.approx(recorded[key], abs=0.05), key

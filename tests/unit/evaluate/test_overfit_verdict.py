"""The overfit gate's rule (`eyas.evaluate.overfit.verdict`) and its samples, without a model."""

from __future__ import annotations

import json

import pytest

from eyas.errors import DataError
from eyas.evaluate.overfit import NEAR_MAX, gate_prompts, gate_records, verdict


def test_a_drafter_that_did_not_memorise_fails_before_serving_is_judged():
    ok, said = verdict(NEAR_MAX * 4 - 0.01, 4.0, 3)
    assert not ok and "did not memorise" in said


def test_the_measured_accept_length_must_stay_within_the_tolerance():
    assert verdict(3.6, 3.6 * 0.86, 3, tolerance=0.15)[0]
    ok, said = verdict(3.6, 3.6 * 0.84, 3, tolerance=0.15)
    assert not ok and "below the 3.06" in said and "check-export" in said


def test_gate_samples_are_the_prompts_with_the_targets_answers(tmp_path):
    merged = tmp_path / "train.jsonl"
    merged.write_text("\n".join(json.dumps(r) for r in [
        {"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1]},          # no prompt: skipped
        {"input_ids": [4, 5, 6, 7], "loss_mask": [0, 0, 1, 1]},
        {"input_ids": [8, 9, 10], "loss_mask": [0, 1, 1]}]) + "\n")
    prompts = gate_prompts(merged, 2)
    assert prompts == [[4, 5], [8]]
    recs = gate_records(prompts, [[11, 12], [13]])
    assert recs[0]["input_ids"] == [4, 5, 11, 12] and recs[0]["loss_mask"] == [0, 0, 1, 1]
    with pytest.raises(DataError, match="with nothing"):
        gate_records(prompts, [[11], []])
    with pytest.raises(DataError, match="at most 0 tokens"):
        gate_prompts(merged, 2, max_prompt_tokens=0)

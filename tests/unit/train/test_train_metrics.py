"""Per-step accuracy and acceptance length τ: one definition (bonus token counted)."""

from __future__ import annotations

import math

import pytest
import torch

from eyas.train.metrics import (
    acceptance_length,
    acceptance_lengths,
    accuracies,
    summarise,
    upgrade_record,
)


def test_tau_counts_the_bonus_token_and_sums_running_products():
    acc = [0.8, 0.6, 0.3]
    assert math.isclose(acceptance_length(acc), 1 + 0.8 + 0.48 + 0.144)
    assert math.isclose(acceptance_length(acc, 1), 1.8)
    assert acceptance_length([0.0, 0.9]) == 1.0  # nothing accepted: the target's token alone
    assert acceptance_length([1.0] * 7) == 8.0  # everything accepted: 7 drafts + 1
    with pytest.raises(ValueError, match="needs 4 per-step accuracies, got 3"):
        acceptance_length(acc, 4)


def test_records_carry_tau_for_three_steps_and_the_trained_unroll():
    correct, total = torch.tensor([9, 8, 6, 5, 4, 3, 2]), torch.tensor([10] * 7)
    m = summarise(correct, total)
    assert m["acc"] == [0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2]
    assert list(m["acceptance_length"]) == ["3", "7"]
    assert math.isclose(m["acceptance_length"]["3"], 1 + 0.9 + 0.72 + 0.432)
    assert m["simulated_acceptance_length"] == m["acceptance_length"]["7"]
    assert list(acceptance_lengths([0.5, 0.5])) == ["2"]  # k < 3: only the trained unroll
    assert accuracies(torch.tensor([0, 1]), torch.tensor([0, 2])) == [0.0, 0.5]


def test_an_old_record_is_recomputed_from_its_accuracies():
    old = {"kind": "eval", "step": 4, "acc": [0.5, 0.5, 0.5], "simulated_acceptance_length": 0.875}
    new = upgrade_record(old)
    assert new["simulated_acceptance_length"] == 1.875
    assert new["acceptance_length"] == {"3": 1.875}
    assert upgrade_record(new) is new

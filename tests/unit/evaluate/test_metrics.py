"""The report's figures from hand-made generations: τ, acceptance by position, costs, the
predicted speedup, and training's simulated τ beside the measured one."""

from __future__ import annotations

import pytest

from eyas.evaluate import metrics
from eyas.evaluate.speculate import Generation


def gen(proposed, accepted, kept=None, **kw):
    kept = kept or [a + 1 for a in accepted]
    return Generation(tokens=[0] * (1 + sum(kept)), accept_lengths=kept, proposed=proposed,
                      accepted=accepted, **kw)


def test_tau_counts_the_bonus_token_per_verification():
    gens = [gen([3, 3, 3], [3, 0, 1]), gen([3], [2])]
    # (4 + 1 + 2 + 3) tokens over 4 verifications
    assert metrics.acceptance_length(gens) == pytest.approx(10 / 4)
    assert metrics.acceptance_length([gen([], [])]) is None


def test_acceptance_by_position_is_conditional_on_the_earlier_drafts():
    gens = [gen([3, 3, 3, 2, 0], [3, 0, 1, 2, 0])]
    rows = metrics.per_position(gens, 3)
    # position 1: proposed in 4 cycles (one proposed nothing), accepted in 3
    assert [(r["reached"], r["accepted"]) for r in rows] == [(4, 3), (3, 2), (1, 1)]
    assert rows[0]["rate"] == pytest.approx(0.75) and rows[2]["at_least"] == pytest.approx(1 / 5)


def test_costs_and_predicted_speedup():
    plain = [Generation(tokens=[0] * 11, target_seconds=0.010, target_calls=10)]  # 1 ms/step
    drafted = [Generation(tokens=[0] * 11, target_seconds=0.006, target_calls=4,
                          draft_seconds=0.0024, draft_steps=12)]  # 0.2 ms/draft, 1.5 ms/verify
    c = metrics.costs(plain, drafted, 3)
    assert c["target_step_ms"] == pytest.approx(1.0) and c["draft_step_ms"] == pytest.approx(0.2)
    assert c["draft_to_target"] == pytest.approx(0.2) and c["verify_ms"] == pytest.approx(1.5)
    assert metrics.predicted_speedup(2.5, c) == pytest.approx(2.5 * 1.0 / (3 * 0.2 + 1.5))


def test_serving_speed_is_predicted_only_from_costs_measured_on_the_serving_engine():
    none = metrics.serving_prediction(2.5, 3, {"rows": [], "verdict": ""})
    assert none["value"] is None and none["note"].startswith("not predicted: no draft")
    costs = {"engine": "SGLang", "target_step_ms": 11.0, "draft_step_ms": 1.0, "verify_ms": 13.0,
             "method": "fit over num_steps (cycle = k · draft + verify)"}
    pred = metrics.serving_prediction(2.5, 3, {"draft_cost_measured": costs})
    assert pred["value"] == pytest.approx(2.5 * 11 / (3 + 13))
    assert "serving engine" in pred["note"] and "fit over num_steps" in pred["note"]
    partial = metrics.serving_prediction(
        2.5, 3, {"draft_cost_measured": costs | {"draft_step_ms": None, "verify_ms": None}})
    assert partial["value"] is None and "draft_step_ms, verify_ms missing" in partial["note"]
    assert metrics.serving_prediction(None, 3, {"draft_cost_measured": costs})["value"] is None

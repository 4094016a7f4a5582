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
    costs = {"target_step_ms": 11.0, "draft_step_ms": 1.0, "verify_ms": 13.0, "num_steps": 3}
    pred = metrics.serving_prediction(2.5, 3, {"costs": costs})
    assert pred["value"] == pytest.approx(2.5 * 11 / (3 + 13)) and "serving engine" in pred["note"]
    other_k = metrics.serving_prediction(2.5, 5, {"costs": costs})
    assert other_k["value"] is None and "3 draft steps" in other_k["note"]
    partial = metrics.serving_prediction(2.5, 3, {"costs": {"target_step_ms": 11.0}})
    assert partial["value"] is None and "draft_step_ms" in partial["note"]


def test_simulated_tau_from_training_accuracies_and_the_gap_flag():
    assert metrics.simulated_acceptance_length([0.5, 0.5, 0.5, 0.9], 3) == pytest.approx(1.875)
    assert metrics.simulated_acceptance_length([0.5], 3) == pytest.approx(1.5)
    ok = metrics.compare_simulated({"acc": [0.5, 0.5, 0.5], "step": 7}, 1.8, 3, 0.25)
    assert ok["available"] and not ok["flagged"] and ok["relative_gap"] == pytest.approx(-0.04)
    bad = metrics.compare_simulated({"acc": [0.9, 0.9, 0.9]}, 1.2, 3, 0.25)
    assert bad["flagged"] and "differs" in bad["note"]
    none = metrics.compare_simulated(None, 1.2, 3, 0.25)
    assert not none["available"] and not none["flagged"]


def test_bootstrap_intervals_over_prompts_are_paired_seeded_and_claim_only_beyond_zero():
    # 8 prompts: the trained drafter keeps 3 tokens per verification on every prompt; "close"
    # keeps 3 on half the prompts and 2 or 4 on the others (level on average); "weak" keeps 1.
    trained = [gen([3] * 4, [2] * 4) for _ in range(8)]
    close = [gen([3] * 4, [a] * 4) for a in (2, 1, 2, 3, 2, 1, 2, 3)]
    weak = [gen([3] * 4, [0] * 4) for _ in range(8)]
    res = {"eagle3": trained, "close": close, "weak": weak}
    boot = metrics.bootstrap_ci95(res, "eagle3")
    assert boot == metrics.bootstrap_ci95(res, "eagle3")  # seeded: the same report twice
    assert boot["ci95"]["eagle3"] == pytest.approx([3.0, 3.0])
    lo, hi = boot["ci95"]["close"]
    assert lo < metrics.acceptance_length(close) == 3.0 < hi and hi - lo < 1.5
    assert metrics.comparison(boot["difference_ci95"]["weak"]) == "ahead"
    assert boot["difference_ci95"]["weak"] == pytest.approx([2.0, 2.0])
    assert metrics.comparison(boot["difference_ci95"]["close"]) == "within noise"
    assert metrics.comparison([-0.5, -0.1]) == "behind"
    # Restricted to a dataset's prompts; one prompt gives no interval.
    part = metrics.bootstrap_ci95(res, "eagle3", [1, 5])
    assert part["ci95"]["close"] == pytest.approx([2.0, 2.0])
    one = metrics.bootstrap_ci95(res, "eagle3", [0])
    assert one["ci95"]["eagle3"] is None and metrics.comparison(
        one["difference_ci95"]["weak"]) == "not computed"

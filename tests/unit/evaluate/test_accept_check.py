"""SGLang's accept length beside the offline τ and training's simulated τ (the users' class of
bug: an EAGLE-3 drafter served with ``--speculative-algorithm EAGLE`` accepts nothing)."""

from __future__ import annotations

import pytest

from eyas.evaluate.accept_check import accept_check


def _report(served: float, *, offline: float | None = 2.4, steps: int = 3, temperature=0.0):
    rows = [{"mode": "baseline", "batch_size": 1, "num_steps": None, "eagle_topk": None,
             "num_draft_tokens": None, "output_tok_s": 90.0, "accept_length": None},
            {"mode": "eagle3", "batch_size": 8, "num_steps": steps, "eagle_topk": 1,
             "num_draft_tokens": steps + 1, "output_tok_s": 300.0, "accept_length": served + 0.1},
            {"mode": "eagle3", "batch_size": 1, "num_steps": steps, "eagle_topk": 1,
             "num_draft_tokens": steps + 1, "output_tok_s": 150.0, "accept_length": served}]
    # 100 verification steps: 70 accepted the first draft, 50 two, 20 all three.
    per_position = [{"position": 1, "reached": 100, "accepted": 70},
                    {"position": 2, "reached": 70, "accepted": 50},
                    {"position": 3, "reached": 50, "accepted": 20}]
    return {"draft_tokens": 3, "mode": "greedy", "acceptance_length": offline,
            "per_position": per_position, "config": {"gap_warning": 0.25},
            "simulated": {"available": True, "acc": [0.8, 0.7, 0.6]},
            "serving": {"rows": rows, "verdict": "v", "config": {"temperature": temperature}}}


def test_accept_length_one_is_flagged_with_the_eagle_flag_as_first_cause():
    check = accept_check(_report(1.0))
    assert check["served"] == 1.0 and check["served_setting"]["batch_size"] == 1
    assert check["reference"] == "offline τ" and check["offline"] == 2.4
    assert check["simulated"] == pytest.approx(1 + 0.8 + 0.56 + 0.336)
    assert check["flagged"] and "no draft token is accepted" in check["note"]
    assert "--speculative-algorithm EAGLE" in check["causes"][0]
    assert any("d2t" in c for c in check["causes"])


def test_a_gap_within_the_band_is_not_flagged_one_beyond_it_is():
    ok = accept_check(_report(2.2))
    assert not ok["flagged"] and "agrees" in ok["note"]
    # E[X] = .7 + .5 + .2 = 1.4, E[X²] = 1(.7) + 3(.5) + 5(.2) = 3.2: variance 1.24
    assert ok["band"] == pytest.approx(1.96 * 1.24 ** 0.5 / 10, rel=1e-6)
    low = accept_check(_report(1.6))
    assert low["flagged"] and any("off by one" in c for c in low["causes"])


def test_without_a_comparable_offline_tau_the_simulated_one_is_the_reference():
    no_offline = accept_check(_report(1.0, offline=None))
    assert no_offline["reference"] == "training's simulated τ" and no_offline["flagged"]
    sampled = accept_check(_report(2.6, temperature=0.7))
    assert sampled["reference"] == "training's simulated τ" and not sampled["flagged"]
    assert not accept_check({"draft_tokens": 3, "serving": None})["available"]

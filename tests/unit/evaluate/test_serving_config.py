"""ServingConfig: the speculative grid follows SGLang 0.5.23's own rules; bad values are refused
with the field named."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from eyas.evaluate.serving_config import ServingConfig, SpecKnobs, max_draft_tokens


def test_defaults_sweep_two_chains_at_batch_1_8_32():
    cfg = ServingConfig()
    assert cfg.batch_sizes == [1, 8, 32] and cfg.port == 30000 and cfg.tp_size == 1
    assert cfg.spec_grid() == [SpecKnobs(3, 1, 4), SpecKnobs(5, 1, 6)]
    assert cfg.skipped_knobs() == []


def test_topk_1_uses_steps_plus_one_draft_tokens_without_duplicates():
    cfg = ServingConfig(num_steps=[3, 3, 2], eagle_topk=[1], num_draft_tokens=[4, 8, 16])
    assert cfg.spec_grid() == [SpecKnobs(2, 1, 3), SpecKnobs(3, 1, 4)]


def test_tree_settings_beyond_what_the_tree_can_fill_are_skipped_with_the_reason():
    assert max_draft_tokens(1, 4) == 5 and max_draft_tokens(3, 4) == 37
    cfg = ServingConfig(num_steps=[1, 3], eagle_topk=[4], num_draft_tokens=[8, 16])
    assert cfg.spec_grid() == [SpecKnobs(3, 4, 8), SpecKnobs(3, 4, 16)]
    (skipped, why), (skipped2, _) = cfg.skipped_knobs()
    assert (skipped, skipped2) == (SpecKnobs(1, 4, 8), SpecKnobs(1, 4, 16))
    assert "num_draft_tokens 8 > 5" in why
    with pytest.raises(ValidationError, match="no valid speculative setting"):
        ServingConfig(num_steps=[1], eagle_topk=[4], num_draft_tokens=[8])
    assert SpecKnobs(3, 1, 4).label() == "steps 3 / topk 1 / 4 draft tokens"


@pytest.mark.parametrize(("fields", "words"), [
    ({"batch_sizes": []}, "at least one value"),
    ({"num_steps": [0, 3]}, ">= 1"),
    ({"batch_sizes": [1, 64], "num_prompts": 32}, "at least the largest batch size"),
    ({"health_path": "health"}, "must start with '/'"),
    ({"port": 80}, "greater than or equal to 1024"),
    ({"nonsense": 1}, "Extra inputs are not permitted"),
])
def test_bad_values_are_refused_naming_the_field(fields, words):
    with pytest.raises(ValidationError, match=words) as info:
        ServingConfig(**fields)
    name = next(iter(fields))
    assert name in str(info.value) or words == "at least the largest batch size"


def test_lists_are_sorted_and_deduplicated():
    cfg = ServingConfig(batch_sizes=[32, 1, 8, 8])
    assert cfg.batch_sizes == [1, 8, 32]


def test_host_paths_default_to_the_run_layout():
    assert ServingConfig().host_paths("/data/runs/100k/", "/data/models/kimi") == (
        "/data/models/kimi", "/data/runs/100k/drafter/export", "/data/runs/100k/merged/eval.jsonl")
    cfg = ServingConfig(model_path="/m", draft_model_path="/d", prompts="/p.jsonl")
    assert cfg.host_paths("/w", "/t") == ("/m", "/d", "/p.jsonl")

"""The evaluate section of the pipeline config: defaults, the tiny recipe, errors naming fields."""

from __future__ import annotations

import pytest
from support.paths import REPO

from eyas.config import load_config, parse_config
from eyas.errors import ConfigError


def test_defaults_and_the_tiny_recipe():
    cfg = parse_config({"name": "x", "target": {"model": "m"}, "datasets": []})
    e = cfg.evaluate
    assert (e.draft_tokens, e.mode, e.merged_eval, e.baselines) == (3, "greedy", True,
                                                                     ["untrained", "ngram"])
    tiny = load_config(REPO / "recipes" / "tiny-demo.yaml").evaluate
    assert tiny.prompt_files == ["eyas:demo/eval_prompts.jsonl"] and tiny.threads == 1


def test_bad_evaluate_fields_are_named():
    raw = {"name": "x", "target": {"model": "m"}, "datasets": [],
           "evaluate": {"draft_tokens": 0, "mode": "beam", "baselines": ["oracle"]}}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, where="run.yaml")
    text = str(err.value)
    for field in ("evaluate.draft_tokens", "evaluate.mode", "evaluate.baselines.0"):
        assert field in text, field

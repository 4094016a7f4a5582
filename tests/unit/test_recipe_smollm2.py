"""recipes/smollm2-sharegpt.yaml and its smoke size: valid, the same pipeline at two sizes."""

from __future__ import annotations

from support.paths import REPO

from eyas.config import load_config
from eyas.prepare.phases import builds_target

RECIPES = REPO / "recipes"


def test_real_recipe_names_the_packaged_target_and_data():
    cfg = load_config(RECIPES / "smollm2-sharegpt.yaml")
    assert cfg.target.model == "eyas:smollm2" and builds_target(cfg.target.model)
    regen, kept = cfg.datasets
    assert (regen.source, regen.regenerate) == ("eyas:sharegpt", True)
    assert regen.limit >= 1000  # at least 1,000 prompts read; rejects and long prompts aside
    assert (kept.source, kept.regenerate, kept.skip) == ("eyas:sharegpt", False, regen.limit)
    assert cfg.tokenize.on_bad_record == "reject"  # the packaged file is cut off
    assert cfg.generation.temperature > 0 and cfg.generation.top_p is not None
    assert cfg.evaluate.prompt_files == ["eyas:humaneval"]
    assert set(cfg.evaluate.baselines) == {"untrained", "ngram"}


def test_smoke_recipe_is_the_real_one_smaller():
    full = load_config(RECIPES / "smollm2-sharegpt.yaml").model_dump(mode="json")
    smoke = load_config(RECIPES / "smollm2-sharegpt-smoke.yaml").model_dump(mode="json")
    assert smoke["target"] == full["target"]
    # The full recipe computes in bf16 (a CPU with AMX); the smoke size runs on any CPU.
    assert {**smoke["extract"], "compute_dtype": "bfloat16"} == full["extract"]
    assert [d["source"] for d in smoke["datasets"]] == [d["source"] for d in full["datasets"]]
    regen, kept = smoke["datasets"]
    assert kept["skip"] >= regen["skip"] + regen["limit"]  # disjoint records
    assert smoke["evaluate"]["prompt_files"] == full["evaluate"]["prompt_files"]
    # The full recipe trains by epochs (its steps follow its records); the smoke size sees
    # fewer samples than the full one reads prompts for a single pass.
    assert full["train"]["epochs"] >= 1 and smoke["train"]["epochs"] is None
    assert (smoke["train"]["steps"] * smoke["train"]["micro_batch"]
            < full["datasets"][0]["limit"])

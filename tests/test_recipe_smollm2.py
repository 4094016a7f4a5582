"""recipes/smollm2-sharegpt.yaml and its smoke size: valid, the same pipeline at two sizes."""

from __future__ import annotations

from pathlib import Path

from eyas.config import load_config
from eyas.prepare.phases import builds_target

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def test_real_recipe_names_the_packaged_target_and_data():
    cfg = load_config(RECIPES / "smollm2-sharegpt.yaml")
    assert cfg.target.model == "eyas:smollm2" and builds_target(cfg.target.model)
    regen, kept = cfg.datasets
    assert (regen.source, regen.regenerate, regen.limit) == ("eyas:sharegpt", True, 1000)
    assert (kept.source, kept.regenerate, kept.skip) == ("eyas:sharegpt", False, 1000)
    assert cfg.tokenize.on_bad_record == "reject"  # the packaged file is cut off
    assert cfg.generation.temperature > 0 and cfg.generation.top_p is not None
    assert cfg.evaluate.prompt_files == ["eyas:humaneval"]
    assert set(cfg.evaluate.baselines) == {"untrained", "ngram"}


def test_smoke_recipe_is_the_real_one_smaller():
    full = load_config(RECIPES / "smollm2-sharegpt.yaml").model_dump(mode="json")
    smoke = load_config(RECIPES / "smollm2-sharegpt-smoke.yaml").model_dump(mode="json")
    for key in ("target", "extract"):
        assert smoke[key] == full[key]
    assert [d["source"] for d in smoke["datasets"]] == [d["source"] for d in full["datasets"]]
    regen, kept = smoke["datasets"]
    assert kept["skip"] >= regen["skip"] + regen["limit"]  # disjoint records
    assert smoke["evaluate"]["prompt_files"] == full["evaluate"]["prompt_files"]
    assert smoke["train"]["steps"] < full["train"]["steps"]

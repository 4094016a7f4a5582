"""A tiny run for the preflight tests: merged tiny-target records and the tiny-demo recipe at
test size (CPU, a few samples, 2 training steps, a small disk probe)."""

from __future__ import annotations

from pathlib import Path

import yaml

from eyas.train.tiny_data import tiny_records, write_jsonl
from support.paths import REPO


def tiny_run(root: Path, tiny_target: Path, **preflight) -> tuple[Path, Path]:
    """``(recipe, workdir)``: the workdir holds merged/train.jsonl (8 records) and eval.jsonl
    (2); the recipe is the tiny demo on CPU with `preflight` over the test-size section."""
    workdir = root / "run"
    write_jsonl(workdir / "merged" / "train.jsonl", tiny_records(tiny_target, 8))
    write_jsonl(workdir / "merged" / "eval.jsonl", tiny_records(tiny_target, 2, heldout=True))
    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml").read_text())
    raw["merge"]["max_seq_len"] = 96
    raw["extract"] = {"device": "cpu"}
    raw["train"].update(micro_batch=2, ttt_steps=2, device="cpu", warmup_steps=1)
    raw["evaluate"]["device"] = "cpu"
    raw["preflight"] = {"samples": 4, "train_steps": 2, "disk_probe_mb": 4,
                        "check_timeout_s": 240, "collective_timeout_s": 90,
                        "max_new_tokens": 8, **preflight}
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    return recipe, workdir

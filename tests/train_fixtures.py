"""Helpers of the train-drafter flow tests (local and over SSH): a tiny recipe with a few
training steps, and a run folder holding merged tiny-target data."""

from __future__ import annotations

from pathlib import Path

import yaml

from eyas.train.tiny_data import tiny_records, write_jsonl

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 4


def recipe(tmp_path: Path, name: str) -> Path:
    """The tiny-demo recipe named `name`, training STEPS steps on CPU with small sizes."""
    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml").read_text())
    raw["name"] = name
    raw["merge"]["max_seq_len"] = 96  # training follows it
    raw["train"] = {"steps": STEPS, "eval_every": 2, "checkpoint_every": 2, "log_every": 1,
                    "ttt_steps": 3, "micro_batch": 2, "lr": 1e-3,
                    "warmup_steps": 1, "draft_vocab_size": 4100, "device": "cpu"}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def merged_run(tmp_path: Path, tiny_target: Path) -> Path:
    """``<tmp_path>/run`` with merged/train.jsonl (8 Q&A) and eval.jsonl (4 held-out ones)."""
    workdir = tmp_path / "run"
    write_jsonl(workdir / "merged" / "train.jsonl", tiny_records(tiny_target, 8))
    write_jsonl(workdir / "merged" / "eval.jsonl", tiny_records(tiny_target, 4, heldout=True))
    return workdir

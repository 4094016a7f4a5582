"""Inputs of the pipeline tests: the tiny demo recipe at test size; prepared datasets and an
old run's outputs, as the pipeline flow finds them on a host."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from eyas.io import AtomicJsonlWriter
from eyas.manifest import write_manifest
from support.paths import REPO


def small_recipe(path: Path, name: str = "whole-test") -> Path:
    """The tiny demo at test size, written to `path`: few records, short answers, 4 training
    steps, 2 evaluation prompts (the whole job in a minute or two on 2 cores)."""
    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml").read_text())
    raw["name"] = name
    for ds in raw["datasets"]:
        ds["limit"] = 4 if ds["name"] == "demo_long" else 8
    raw["generation"]["max_tokens"] = 16
    raw["merge"].update(max_seq_len=256, eval_fraction=0.2)
    raw["extract"] = {"shard_size": 8, "batch_tokens": 512, "device": "cpu",
                      "storage": "topk", "topk": 8}
    raw["train"] = {"steps": 4, "eval_every": 2, "checkpoint_every": 2, "log_every": 1,
                    "ttt_steps": 3, "micro_batch": 2, "lr": 1e-3, "warmup_steps": 1,
                    "draft_vocab_size": 4100, "device": "cpu"}
    raw["evaluate"] = {"prompt_files": ["eyas:demo/eval_prompts.jsonl"],
                       "prompts_per_dataset": 2, "max_new_tokens": 8, "threads": 1,
                       "device": "cpu"}
    path.write_text(yaml.safe_dump(raw))
    return path


def make_prepared(workdir: Path, names: list[str], records: int = 1500) -> None:
    """Tokenized datasets with manifests, as phase 2 leaves them."""
    rng = random.Random(0)
    for name in names:
        folder = workdir / "prepared" / name
        with AtomicJsonlWriter(folder / "tokenized_data.jsonl") as w:
            for i in range(records):
                n = rng.randint(20, 400)
                w.write({"id": f"{name}-{i}", "input_ids": [rng.randrange(1000) for _ in range(n)],
                         "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)})
        write_manifest(folder, phase="tokenize", outputs=["tokenized_data.jsonl"], counts={"samples": records})


def make_old_hidden(root: Path, files: int = 400) -> int:
    folder = root / "old-run" / "hidden"
    folder.mkdir(parents=True)
    blob = b"\0" * 65536
    for i in range(files):
        (folder / f"shard-{i:05d}.safetensors").write_bytes(blob)
    return files * len(blob)

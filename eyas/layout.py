"""Where each phase keeps its outputs under a run's work directory.

    <workdir>/generated/<dataset>/responses.jsonl     phase 1 (append-only, keyed by id)
    <workdir>/generated/<dataset>/manifest.json       written once every id is answered
    <workdir>/prepared/<dataset>/tokenized_data.jsonl phase 2
    <workdir>/prepared/<dataset>/stats.json
    <workdir>/prepared/<dataset>/rejects.jsonl        only when records were rejected
    <workdir>/prepared/<dataset>/manifest.json
    <workdir>/merged/train.jsonl                      phase 3
    <workdir>/merged/eval.jsonl
    <workdir>/merged/stats.json
    <workdir>/merged/manifest.json
    <workdir>/hidden/<split>/shard-00000/...          phase 4 (data.safetensors + manifest.json)
    <workdir>/drafter/{checkpoint,best,export}/...    phase 5 (export/ is the SGLang folder)
    <workdir>/drafter/history.json                    phase 5 (every logged step and evaluation)
    <workdir>/evaluate/report.{json,html}             phase 6 (+ generations.jsonl, manifest.json)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "EYAS_CACHE_DIR"
"""Environment variable naming the cache root (`cache_dir`)."""


def cache_dir() -> Path:
    """The eyas cache root, shared by every run on the machine (the tiny and real targets
    assembled once, the demo data, the table of verified checksums): ``$EYAS_CACHE_DIR``,
    else ``~/.cache/eyas``. Created if missing."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "eyas").expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root

SPLITS = ("train", "eval")
"""The merged data's splits (``merged/<split>.jsonl``), each extracted to ``hidden/<split>/``."""


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run's outputs; creates nothing by itself."""

    workdir: Path

    def generated_dir(self, dataset: str) -> Path:
        return self.workdir / "generated" / dataset

    def responses(self, dataset: str) -> Path:
        return self.generated_dir(dataset) / "responses.jsonl"

    def prepared_dir(self, dataset: str) -> Path:
        return self.workdir / "prepared" / dataset

    def tokenized(self, dataset: str) -> Path:
        return self.prepared_dir(dataset) / "tokenized_data.jsonl"

    def prepared_stats(self, dataset: str) -> Path:
        return self.prepared_dir(dataset) / "stats.json"

    def rejects(self, dataset: str) -> Path:
        return self.prepared_dir(dataset) / "rejects.jsonl"

    @property
    def merged_dir(self) -> Path:
        return self.workdir / "merged"

    @property
    def train(self) -> Path:
        return self.merged_dir / "train.jsonl"

    @property
    def eval(self) -> Path:
        return self.merged_dir / "eval.jsonl"

    @property
    def merged_stats(self) -> Path:
        return self.merged_dir / "stats.json"

    def hidden_dir(self, split: str = "train") -> Path:
        """Phase 4 output for one split (``train`` / ``eval``): a folder of shard folders."""
        return self.workdir / "hidden" / split

    @property
    def drafter_dir(self) -> Path:
        """Phase 5 output: checkpoint, best weights, history and the exported drafter."""
        return self.workdir / "drafter"

    @property
    def evaluate_dir(self) -> Path:
        """Phase 6 output: ``report.json``, ``report.html``, ``generations.jsonl``, manifest."""
        return self.workdir / "evaluate"

"""Where each phase keeps its outputs under a run's work directory.

    <workdir>/generated/<dataset>/responses.jsonl     phase 1 (append-only, keyed by id)
    <workdir>/generated/<dataset>/manifest.json       written once every id is answered
    <workdir>/generated/<dataset>/settings.json       the generation settings the answers hold
    <workdir>/prepared/<dataset>/tokenized_data.jsonl phase 2
    <workdir>/prepared/<dataset>/stats.json
    <workdir>/prepared/<dataset>/rejects.jsonl        only when records were rejected
    <workdir>/prepared/<dataset>/manifest.json
    <workdir>/merged/train.jsonl                      phase 3
    <workdir>/merged/eval.jsonl
    <workdir>/merged/stats.json
    <workdir>/merged/manifest.json
    <workdir>/hidden/<split>/shard-00000/...          phase 4 (data.safetensors + manifest.json)
    <workdir>/hidden/<split>/placement.json           phase 4 on several hosts (shard -> host)
    <workdir>/drafter/{checkpoint,best,export}/...    phase 5 (export/ is the SGLang folder)
    <workdir>/drafter/history.json                    phase 5 (every logged step and evaluation)
    <workdir>/drafter/settings.json                   phase 5 (what a checkpoint was trained with)
    <workdir>/drafter/trained_from.json               phase 5 (the cache's stamp of the export)
    <workdir>/evaluate/report.{json,html}             phase 6 (+ generations.jsonl, manifest.json)
    <workdir>/evaluate/evaluated_from.json            phase 6 (the cache's stamp of the report)
    <workdir>/reports/{composition,training}.png      the pictures of the run's artifacts
    <workdir>/.eyas/<phase>.yaml                      the settings a phase's job reads
    <workdir>/.eyas/jobs/<job id>/                    the detached jobs run here (eyas.remote.jobs)
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

CHECKPOINT = "checkpoint"
"""A drafter folder's newest checkpoint (``state.pt`` + ``meta.json``)."""
BEST = "best"
"""A drafter folder's best evaluation's weights (``drafter.safetensors`` + ``metrics.json``)."""
EXPORT = "export"
"""A drafter folder's SGLang EAGLE-3 folder, from the best weights."""
HISTORY = "history.json"
"""A drafter folder's every logged step and evaluation."""
VOCAB = "vocab"
"""A drafter folder's cached draft vocabulary."""

REPORT = "report.json"
"""An evaluation folder's figures (`eyas.evaluate.run`)."""
REPORT_HTML = "report.html"
"""An evaluation folder's page, drawn from ``report.json``."""
GENERATIONS = "generations.jsonl"
"""An evaluation folder's tokens and accept lengths per prompt and method."""

PLACEMENT = "placement.json"
"""A split's placement record, in ``hidden/<split>/`` on the run's host (`eyas.extract.placement`)."""

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

    def generation_settings(self, dataset: str) -> Path:
        """The settings the answers of ``generated/<dataset>/`` were made with."""
        return self.generated_dir(dataset) / "settings.json"

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

    def merged(self, split: str) -> Path:
        """The merged records of one split (``train`` / ``eval``)."""
        return self.merged_dir / f"{split}.jsonl"

    @property
    def train(self) -> Path:
        return self.merged("train")

    @property
    def eval(self) -> Path:
        return self.merged("eval")

    @property
    def merged_stats(self) -> Path:
        return self.merged_dir / "stats.json"

    @property
    def merged_manifest(self) -> Path:
        return self.merged_dir / "manifest.json"

    def hidden_dir(self, split: str = "train") -> Path:
        """Phase 4 output for one split (``train`` / ``eval``): a folder of shard folders."""
        return self.workdir / "hidden" / split

    def placement(self, split: str) -> Path:
        """The record of which host extracts which shard of `split` (several hosts)."""
        return self.hidden_dir(split) / PLACEMENT

    @property
    def drafter_dir(self) -> Path:
        """Phase 5 output: checkpoint, best weights, history and the exported drafter."""
        return self.workdir / "drafter"

    @property
    def checkpoint(self) -> Path:
        return self.drafter_dir / CHECKPOINT

    @property
    def best(self) -> Path:
        return self.drafter_dir / BEST

    @property
    def export(self) -> Path:
        """The exported drafter (the SGLang folder)."""
        return self.drafter_dir / EXPORT

    @property
    def history(self) -> Path:
        return self.drafter_dir / HISTORY

    @property
    def vocab(self) -> Path:
        return self.drafter_dir / VOCAB

    @property
    def resume_record(self) -> Path:
        """The settings and data the checkpoint of ``drafter/`` is trained with (its resume
        claim)."""
        return self.drafter_dir / "settings.json"

    @property
    def trained_from(self) -> Path:
        """The cache's stamp of ``drafter/export``: the inputs and settings it was made from."""
        return self.drafter_dir / "trained_from.json"

    @property
    def evaluate_dir(self) -> Path:
        """Phase 6 output: ``report.json``, ``report.html``, ``generations.jsonl``, manifest."""
        return self.workdir / "evaluate"

    @property
    def report(self) -> Path:
        return self.evaluate_dir / REPORT

    @property
    def report_html(self) -> Path:
        return self.evaluate_dir / REPORT_HTML

    @property
    def generations(self) -> Path:
        return self.evaluate_dir / GENERATIONS

    @property
    def evaluated_from(self) -> Path:
        """The cache's stamp of ``evaluate/``: the inputs and settings it was made from."""
        return self.evaluate_dir / "evaluated_from.json"

    @property
    def reports_dir(self) -> Path:
        """The pictures of the run's Prefect artifacts, kept as files."""
        return self.workdir / "reports"

    @property
    def composition_picture(self) -> Path:
        return self.reports_dir / "composition.png"

    @property
    def training_picture(self) -> Path:
        return self.reports_dir / "training.png"

    def job_settings(self, phase: str) -> Path:
        """The YAML of the config section a phase's job reads (``train``, ``evaluate``): written
        by the task that starts it, where the job runs."""
        return self.workdir / ".eyas" / f"{phase}.yaml"

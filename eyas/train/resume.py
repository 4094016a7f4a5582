"""Which drafter a run's ``drafter/`` folder holds, and what becomes of it: resumed, moved
aside, or found finished. Prefect-free; every file is read and moved through a `Host`
(`eyas.remote.hosts.connect`: this machine or a GPU host, one interface).

A training's identity is `train_settings` (every setting that makes the drafter what it is,
the data kind, the layers it reads). A checkpoint is resumed only under the same
`resume_settings` (the identity less `RESUME_IRRELEVANT`) and the same data: ``claim``
records both in ``drafter/settings.json`` (`RunLayout.resume_record`) before training, and a
``drafter/`` trained under another record is moved aside to
``drafter.replaced-<time>-<hex>/`` (kept, never resumed). A folder whose history reached the
planned steps (`planned_steps`) and whose export verifies is finished: nothing to train.
"""

from __future__ import annotations

import datetime as _dt
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eyas.layout import RunLayout
from eyas.manifest import config_fingerprint, verify_manifest
from eyas.remote.hosts import Host, shell_join

if TYPE_CHECKING:
    from eyas.config import PipelineConfig

RESUME_IRRELEVANT = {"steps", "epochs", "log_every", "eval_every", "eval_samples", "checkpoint_every",
                     "checkpoint_minutes", "device", "precision", "chunk_mb",
                     "activation_checkpointing", "teacher_memo"}
"""Training settings a checkpoint may be resumed under when changed: how long, how often it
logs and saves, where and how fast it computes (`teacher_memo` keeps the teacher's argmax
instead of recomputing the same one). Any other change means another drafter."""

ADDED_AT_OLD_BEHAVIOUR = {"loss": "kl"}
"""Training settings added after drafters were trained, with the value that trains exactly as
eyas did before them: left out of a training's identity while they hold it, so that a run
begun before the upgrade resumes (and a finished one stays Cached) instead of being moved
aside. Any other value is part of the identity like every setting."""


def train_settings(cfg: PipelineConfig, data: str) -> dict:
    """Everything that makes the drafter what it is: the training settings, the data kind,
    the layers it reads."""
    flat = cfg.train.model_dump(mode="json")
    flat.update(flat.pop("mla"))  # the MLA section's fields, at the top as before it was one
    train = {k: v for k, v in flat.items()
             if k not in ADDED_AT_OLD_BEHAVIOUR or v != ADDED_AT_OLD_BEHAVIOUR[k]}
    return {"train": train, "data": data,
            "aux_layers": cfg.extract.aux_layers, "trust_remote_code": cfg.target.trust_remote_code}


def resume_settings(cfg: PipelineConfig, data: str) -> dict:
    """The settings a checkpoint must have been trained with to be resumed (`train_settings`
    less `RESUME_IRRELEVANT`)."""
    settings = train_settings(cfg, data)
    settings["train"] = {k: v for k, v in settings["train"].items() if k not in RESUME_IRRELEVANT}
    return settings


def planned_steps(cfg: PipelineConfig, workdir: str | Path, h: Host, n: int) -> int | None:
    """The steps this training runs with `n` processes: ``train.steps``, or with
    ``train.epochs`` the passes over the merged train records (``merged/manifest.json`` read
    through `h`); None when the epochs cannot be counted yet (no merged data)."""
    from eyas.train.plan import total_steps

    if cfg.train.epochs is None:
        return cfg.train.steps
    manifest = str(RunLayout(Path(workdir)).merged_manifest)
    if not h.exists(manifest):
        return None
    records = json.loads(h.read_text(manifest)).get("counts", {}).get("train_records")
    return total_steps(cfg.train, int(records), n) if records else None


def verifies(h: Host, folder: str) -> bool:
    """Whether `folder`'s manifest verifies (sizes and checksums) on `h`'s machine: here, or
    with the host's eyas interpreter."""
    if h.spec.kind == "local":
        return not verify_manifest(folder)
    code = ("import sys; from eyas.manifest import verify_manifest; "
            "sys.exit(1 if verify_manifest(sys.argv[1]) else 0)")
    return h.run(shell_join(h.spec.eyas_python, "-c", code, folder), check=False).ok


@dataclass(frozen=True)
class Claim:
    """What `claim` found: `finished`, the summary of a training already done for these
    settings and data (None: train, or resume); `moved_aside`, where an earlier ``drafter/``
    trained with other settings or data now is (None: nothing was moved)."""

    finished: dict[str, Any] | None
    moved_aside: str | None = None


def claim(h: Host, cfg: PipelineConfig, workdir: str | Path, data: str,
          data_hashes: dict[str, str], n: int) -> Claim:
    """Make ``<workdir>/drafter/`` (on `h`) this training's, with `n` processes over the data
    whose input checksums are `data_hashes`: a checkpoint or export made with other settings
    or data is moved aside (never resumed), and the record of these settings and data is
    written before training. The `Claim` holds the finished summary (``steps``,
    ``resumed_from``, ``export``, ``best``, ``draft_vocab_size``, ``history``, ``status``
    "complete", ``out``) when the history reached the planned steps and the export verifies."""
    layout = RunLayout(Path(workdir))
    folder, export = layout.drafter_dir, layout.export
    record_file = str(layout.resume_record)
    wanted = {"settings": config_fingerprint(resume_settings(cfg, data)), "data": data_hashes}
    recorded = json.loads(h.read_text(record_file)) if h.exists(record_file) else None
    trained = h.exists(str(layout.checkpoint)) or h.exists(str(export))
    aside = None
    if recorded != wanted and trained:
        aside = (f"{folder}.replaced-{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S}-"
                 f"{secrets.token_hex(3)}")
        h.run(shell_join("mv", str(folder), aside))
        trained = False
    if recorded != wanted or not trained:
        h.mkdir(str(folder))
        h.write_text(record_file, json.dumps(wanted, sort_keys=True))
        return Claim(None, aside)
    history_file = str(layout.history)
    history = json.loads(h.read_text(history_file)) if h.exists(history_file) else []
    steps = max((r["step"] for r in history if r.get("kind") == "train"), default=0)
    target = planned_steps(cfg, workdir, h, n)
    if target is None or steps < target or not verifies(h, str(export)):
        return Claim(None)
    best_file = str(layout.best / "metrics.json")
    best = json.loads(h.read_text(best_file)) if h.exists(best_file) else None
    manifest = json.loads(h.read_text(str(export / "manifest.json")))
    return Claim({"steps": steps, "resumed_from": steps, "export": str(export), "best": best,
                  "draft_vocab_size": manifest.get("counts", {}).get("draft_vocab_size"),
                  "history": history, "status": "complete", "out": str(folder)})

"""Helpers of the train-drafter flow tests (local and over SSH): a tiny recipe with a few
training steps, a run folder holding merged tiny-target data, and a look at the training
processes of a launch (to check that none outlives it)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import yaml

from eyas.train.tiny_data import tiny_records, write_jsonl
from support.paths import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 4


def recipe(tmp_path: Path, name: str, **train) -> Path:
    """The tiny-demo recipe named `name`, training STEPS steps on CPU with small sizes;
    `train` overrides fields of its ``train:`` section."""
    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml").read_text())
    raw["name"] = name
    raw["merge"]["max_seq_len"] = 96  # training follows it
    raw["train"] = {"steps": STEPS, "eval_every": 2, "checkpoint_every": 2, "log_every": 1,
                    "ttt_steps": 3, "micro_batch": 2, "lr": 1e-3,
                    "warmup_steps": 1, "draft_vocab_size": 4100, "device": "cpu", **train}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def merged_run(tmp_path: Path, tiny_target: Path) -> Path:
    """``<tmp_path>/run`` with merged/train.jsonl (8 Q&A) and eval.jsonl (4 held-out ones)."""
    workdir = tmp_path / "run"
    write_jsonl(workdir / "merged" / "train.jsonl", tiny_records(tiny_target, 8))
    write_jsonl(workdir / "merged" / "eval.jsonl", tiny_records(tiny_target, 4, heldout=True))
    return workdir


def processes_with(name: str, value: str) -> list[psutil.Process]:
    """This user's live processes running ``eyas.train.run`` whose environment holds
    ``name=value`` (a marker the test set, or a job's ``EYAS_JOB_ID``), sorted by pid."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if (proc.info["status"] != psutil.STATUS_ZOMBIE
                    and "eyas.train.run" in (proc.info["cmdline"] or [])
                    and proc.environ().get(name) == value):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(found, key=lambda p: p.pid)


def split_launcher(procs: list[psutil.Process]) -> tuple[psutil.Process | None, list[psutil.Process]]:
    """(torchrun's agent, its workers) among `procs` of one launch (workers carry
    ``TORCHELASTIC_RUN_ID``)."""
    launcher, workers = None, []
    for p in procs:
        try:
            if "TORCHELASTIC_RUN_ID" in p.environ():
                workers.append(p)
            else:
                launcher = p
        except psutil.NoSuchProcess:
            continue
    return launcher, workers


def wait_until(condition, seconds: float, what: str) -> None:
    """Return once `condition()` holds; fail when it does not within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s")
        time.sleep(0.05)

"""Build (once) and cache the tiny target model folder.

``build_tiny_target()`` returns ``<cache>/tiny-target-v1``, a Hugging Face model folder
(``config.json``, ``model.safetensors``, ``generation_config.json``, tokenizer files,
``eyas_build.json``, ``manifest.json``) that ``AutoModelForCausalLM`` / ``AutoTokenizer``
load offline. The first call trains it (about 2-3 minutes on 2 CPU threads); later calls,
from any process, return the cached folder. Concurrent callers wait on a file lock in the
cache root, and the folder appears complete or not at all (built in a temporary sibling,
then renamed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from eyas.errors import EyasError
from eyas.io import read_json, write_json
from eyas.manifest import config_fingerprint, write_manifest
from eyas.tiny import cache_dir
from eyas.tiny.corpus import corpus_fingerprint

TARGET_NAME = "tiny-target-v1"
BUILD_INFO = "eyas_build.json"
RECIPE_VERSION = 1
"""Bump when the training data or model code changes: cached builds of other recipes rebuild."""

log = logging.getLogger("eyas.tiny")


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` (created if missing) for the block."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def recipe_fingerprint() -> str:
    """What a build depends on: recipe version, training settings, the stdlib text used."""
    from eyas.tiny.model import TrainSettings

    return config_fingerprint(
        {
            "version": RECIPE_VERSION,
            "settings": TrainSettings().to_json(),
            "corpus": corpus_fingerprint(),
        }
    )


def is_complete(folder: Path) -> bool:
    """True when `folder` is a finished build of the current recipe.

    The build record is written last, so a folder without it is partial; a record of another
    recipe (older code, another Python's stdlib) means the folder is stale.
    """
    info_path = folder / BUILD_INFO
    if not (info_path.is_file() and (folder / "model.safetensors").is_file()):
        return False
    try:
        return read_json(info_path).get("recipe") == recipe_fingerprint()
    except EyasError:
        return False


def build_tiny_target(*, force: bool = False, train_seconds: float | None = None) -> Path:
    """The cached tiny target model folder, built first if missing (or if `force`).

    The cache root is ``$EYAS_CACHE_DIR`` or ``~/.cache/eyas``. A build trains for a fixed
    number of steps (`TrainSettings.steps`), which makes it reproducible; `train_seconds`
    additionally caps training wall time (for quick builds in tests; the cap and the steps
    actually run are recorded in ``eyas_build.json``). An existing complete folder is
    returned as is, whatever `train_seconds` says, unless `force` is set.
    """
    root = cache_dir()
    final = root / TARGET_NAME
    with _locked(root / f"{TARGET_NAME}.lock"):
        if is_complete(final) and not force:
            return final
        tmp = root / f".tmp-{TARGET_NAME}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            _build_into(tmp, train_seconds=train_seconds)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():
            old = root / f".old-{TARGET_NAME}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        return final


def _build_into(folder: Path, *, train_seconds: float | None) -> None:
    """Tokenizer, training and saving, all into `folder` (which must not exist)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from eyas.tiny.model import TrainSettings, train_tiny_llama
    from eyas.tiny.tokenizer import build_tokenizer

    started = time.monotonic()
    folder.mkdir(parents=True)
    build_tokenizer(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    settings = TrainSettings()
    log.info("training the tiny target: %s steps", settings.steps)
    model, stats = train_tiny_llama(tokenizer, settings, log=log.info, max_seconds=train_seconds)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(folder, safe_serialization=True)
    stats["build_seconds"] = round(time.monotonic() - started, 1)
    info = {
        "name": TARGET_NAME,
        "recipe": recipe_fingerprint(),
        "settings": settings.to_json(),
        "train_seconds_cap": train_seconds,
        "builder_pid": os.getpid(),
        "stats": stats,
        "corpus_fingerprint": corpus_fingerprint(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    outputs = sorted(p.name for p in folder.iterdir() if p.is_file())
    write_manifest(
        folder,
        phase="tiny-target",
        outputs=outputs,
        config=dataclasses.asdict(settings),
        counts={"parameters": stats["parameters"], "steps": stats["steps"]},
    )
    write_json(folder / BUILD_INFO, info)  # last: marks the folder complete


def read_build_info(folder: Path) -> dict:
    """The ``eyas_build.json`` record of a tiny-target folder (EyasError if there is none)."""
    if not (folder / BUILD_INFO).is_file():
        raise EyasError(f"{folder}: not a complete tiny-target build (no {BUILD_INFO})")
    return read_json(folder / BUILD_INFO)

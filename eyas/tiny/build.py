"""Build (once) and cache the tiny target model folder from the shipped weights.

``build_tiny_target()`` returns ``<cache>/tiny-target-v2``, a Hugging Face model folder
(``config.json``, float32 ``model.safetensors``, ``generation_config.json``, tokenizer files,
``eyas_build.json``, ``manifest.json``) that ``AutoModelForCausalLM`` / ``AutoTokenizer``
load offline. The first call assembles it from the weights shipped in
``eyas/assets/tiny_target`` (`eyas.tiny.weights`; seconds, no training); later calls, from
any process, return the cached folder. Concurrent callers wait on a file lock in the cache
root, and the folder appears complete or not at all (built in a temporary sibling, then
renamed).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from eyas.errors import EyasError
from eyas.io import locked, read_json, replace_dir, write_json
from eyas.layout import cache_dir
from eyas.manifest import config_fingerprint, write_manifest
from eyas.tiny.weights import RECIPE_VERSION, assemble, read_record, shipped_dir

TARGET_NAME = f"tiny-target-v{RECIPE_VERSION}"
BUILD_INFO = "eyas_build.json"
ASSEMBLY_VERSION = 1
"""Bump when the assembled folder's layout changes (the weights' recipe has its own version)."""

log = logging.getLogger("eyas.tiny")


def recipe_fingerprint() -> str:
    """What a cached folder depends on: the shipped weights' recipe and hash, this assembly."""
    record = read_record()
    return config_fingerprint(
        {
            "assembly": ASSEMBLY_VERSION,
            "recipe": record.get("recipe"),
            "weights": record.get("weights_sha256"),
            "tokenizer": record.get("tokenizer_sha256"),
        }
    )


def is_complete(folder: Path) -> bool:
    """True when `folder` is a finished build of the current recipe.

    The build record is written last, so a folder without it is partial; a record of other
    shipped weights (retrained, or another recipe) means the folder is stale.
    """
    info_path = folder / BUILD_INFO
    if not (info_path.is_file() and (folder / "model.safetensors").is_file()):
        return False
    try:
        return read_json(info_path).get("recipe") == recipe_fingerprint()
    except EyasError:
        return False


def build_tiny_target(*, force: bool = False) -> Path:
    """The cached tiny target model folder, assembled first if missing (or if `force`).

    The cache root is ``$EYAS_CACHE_DIR`` or ``~/.cache/eyas``. The shipped weights are
    checked against the code's recipe first (EyasError listing the problems when they do not
    match). An existing complete folder is returned as is unless `force` is set.
    """
    return build_cached(TARGET_NAME, _build_into, is_complete, force=force)


def build_cached(name: str, build_into: Callable[[Path], None],
                 complete: Callable[[Path], bool], *, force: bool = False) -> Path:
    """``<cache>/<name>``, built by `build_into` (into a temporary sibling, then swapped in)
    unless `complete` says it is there already and not `force`. Concurrent callers, from any
    process, wait on a file lock in the cache root."""
    root = cache_dir()
    final = root / name
    with locked(root / f"{name}.lock"):
        if complete(final) and not force:
            return final
        tmp = root / f".tmp-{name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            build_into(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        replace_dir(tmp, final)
        return final


def _build_into(folder: Path) -> None:
    """Check the shipped weights, assemble them into `folder` (which must not exist)."""
    import torch

    from eyas.tiny.weights import check_shipped

    problems = check_shipped()
    if problems:
        raise EyasError(
            f"the tiny target's shipped weights ({shipped_dir()}) do not match the code:\n  "
            + "\n  ".join(problems)
        )
    started = time.monotonic()
    folder.mkdir(parents=True)
    assemble(folder)
    record = read_record()
    stats = dict(record["stats"])
    stats["build_seconds"] = round(time.monotonic() - started, 1)
    info = {
        "name": TARGET_NAME,
        "recipe": recipe_fingerprint(),
        "weights_recipe": record["recipe"],
        "settings": record["settings"],
        "builder_pid": os.getpid(),
        "stats": stats,
        "answers": record.get("answers"),
        "trained_with": {k: record[k] for k in ("python", "torch", "transformers")},
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    outputs = sorted(p.name for p in folder.iterdir() if p.is_file())
    write_manifest(
        folder,
        phase="tiny-target",
        inputs={"weights": shipped_dir() / "model.safetensors"},
        outputs=outputs,
        config=record["settings"],
        counts={"parameters": stats["parameters"], "steps": stats["steps"]},
    )
    write_json(folder / BUILD_INFO, info)  # last: marks the folder complete


def read_build_info(folder: Path) -> dict:
    """The ``eyas_build.json`` record of a tiny-target folder (EyasError if there is none)."""
    if not (folder / BUILD_INFO).is_file():
        raise EyasError(f"{folder}: not a complete tiny-target build (no {BUILD_INFO})")
    return read_json(folder / BUILD_INFO)

"""Prefect tasks for phases 1-3: thin wrappers over `eyas.prepare.phases`.

Tasks take the config *path* and the workdir (small, hashable, visible in the UI);
they never take clients or large data, and return small stats dicts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact
from prefect.context import TaskRunContext

from eyas.config import load_config
from eyas.layout import RunLayout
from eyas.manifest import config_fingerprint, input_hashes
from eyas.prepare import phases
from eyas.prepare.generate import RequestRejected
from tasks.progress import ThrottledProgress
from tasks.retries import USER_ERRORS, retry_unless
from tasks.secrets import resolve_api_key


def phase_inputs(task_name: str, config_path: str, workdir: str, name: str | None) -> tuple[dict, Any]:
    """The input files and settings that decide a phase's output (its cache identity)."""
    cfg = load_config(config_path)
    layout = RunLayout(Path(workdir))
    if task_name == "tokenize":
        target = phases.resolve_target(cfg)
        tok = phases.resolve_tokenizer(cfg, target)
        return phases.tokenize_inputs(cfg, layout, name, tok), phases.tokenize_settings(cfg, name)
    if task_name == "merge":
        return {d.name: layout.tokenized(d.name) for d in cfg.datasets}, cfg.merge.model_dump(mode="json")
    raise ValueError(task_name)


def phase_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Cache key: task, workdir, input checksums and settings. None (no caching) when an
    input is missing, so a failed precondition is never cached."""
    task_name = context.task.name
    try:
        inputs, settings = phase_inputs(
            task_name, parameters["config_path"], parameters["workdir"], parameters.get("name")
        )
        hashes = input_hashes(inputs)
    except (OSError, Exception):  # noqa: BLE001 - any failure here just disables caching
        return None
    blob = f"{task_name}|{Path(parameters['workdir']).resolve()}|{sorted(hashes.items())}|{config_fingerprint(settings)}"
    return hashlib.sha256(blob.encode()).hexdigest()


_RETRY = retry_unless(*USER_ERRORS, RequestRejected)
"""Not retried: bad settings or data, and requests the server refused (401/403/404/405)."""


@task(name="resolve-target", retries=1, retry_delay_seconds=5)
def resolve_target_task(config_path: str) -> str:
    """The target model folder (builds the tiny demo target once, cached)."""
    return str(phases.resolve_target(load_config(config_path)))


def _generation_progress(name: str) -> Any:
    """A callback for `generate_phase`'s progress: a progress artifact of the dataset."""
    artifact_id = create_progress_artifact(
        progress=0.0, key=f"generate-{name.lower().replace('_', '-')}"[:60],
        description=f"Phase 1: answers generated for {name}",
    )
    progress = ThrottledProgress(artifact_id, interval=2.0)
    return lambda p: progress(p.done, p.total)


@task(name="generate", task_run_name="generate-{name}", retries=2, retry_delay_seconds=[10, 60],
      retry_jitter_factor=0.5, retry_condition_fn=_RETRY)
def generate_task(config_path: str, workdir: str, name: str, base_url: str, model: str) -> dict:
    """Phase 1 for one dataset. A retry requests only the ids still missing."""
    cfg = load_config(config_path)
    logger = get_run_logger()
    api_key = resolve_api_key(cfg.generation)
    stats = phases.generate_phase(
        cfg, RunLayout(Path(workdir)), name, base_url=base_url, model=model, api_key=api_key,
        on_progress=_generation_progress(name),
    )
    logger.info("generate %s: %s", name, stats)
    return stats


@task(name="tokenize", task_run_name="tokenize-{name}", cache_key_fn=phase_cache_key,
      persist_result=True, retries=1, retry_delay_seconds=5, retry_condition_fn=_RETRY)
def tokenize_task(config_path: str, workdir: str, name: str, target_dir: str) -> dict:
    """Phase 2 for one dataset."""
    cfg = load_config(config_path)
    stats = phases.tokenize_phase(cfg, RunLayout(Path(workdir)), name, target_dir=Path(target_dir))
    get_run_logger().info("tokenize %s: %s", name, stats)
    return stats


@task(name="merge", task_run_name="merge", cache_key_fn=phase_cache_key, persist_result=True)
def merge_task(config_path: str, workdir: str, name: str | None = None) -> dict:
    """Phase 3: merge, truncate, shuffle and split every prepared dataset."""
    cfg = load_config(config_path)
    stats = phases.merge_phase(cfg, RunLayout(Path(workdir)))
    get_run_logger().info("merge: %s records, %s tokens", stats.get("records"), stats.get("tokens"))
    return stats

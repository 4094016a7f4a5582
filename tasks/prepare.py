"""Prefect tasks for phases 1-3: thin wrappers over `eyas.prepare.phases`.

Tasks take the typed `PipelineConfig` (loaded once, at the edge) and the workdir; they never
take clients or large data, and return small stats dicts. `generate`, `tokenize` and `merge`
are cached by `tasks.caching.VerifiedOutput`: a hit only while their output folder still holds,
made from the same input files with the same settings by the same task code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact
from prefect.cache_policies import NO_CACHE

from eyas.config import PipelineConfig
from eyas.errors import ConfigError
from eyas.layout import RunLayout
from eyas.prepare import phases
from eyas.prepare.generate import RequestRejected
from eyas.remote.hosts import HostSpec
from tasks.caching import Output, VerifiedOutput, skipped
from tasks.progress import ThrottledProgress
from tasks.retries import USER_ERRORS, retry_unless
from tasks.secrets import resolve_api_key


def _paths(inputs: dict[str, Path]) -> dict[str, str]:
    return {k: str(v) for k, v in inputs.items()}


def generate_output(cfg: PipelineConfig, workdir: str, name: str, model: str) -> Output | None:
    """Phase 1's output of dataset `name`: its answers, from its source, with these settings."""
    try:
        source = phases.resolve_source(cfg, cfg.dataset(name))
    except ConfigError:
        return None
    return Output(str(RunLayout(Path(workdir)).generated_dir(name)),
                  _paths(phases.source_files(source)),
                  phases.generation_settings(cfg, cfg.dataset(name), model))


def tokenize_output(cfg: PipelineConfig, workdir: str, name: str, target_dir: str) -> Output | None:
    """Phase 2's output of dataset `name`: from its answers (or source) and the tokenizer."""
    layout = RunLayout(Path(workdir))
    try:
        tok = phases.resolve_tokenizer(cfg, Path(target_dir))
        inputs = phases.tokenize_inputs(cfg, layout, name, tok)
    except ConfigError:
        return None
    return Output(str(layout.prepared_dir(name)), _paths(inputs), phases.tokenize_settings(cfg, name))


def merge_output(cfg: PipelineConfig, workdir: str, host: HostSpec | None = None) -> Output:
    """Phase 3's output: ``merged/``, from every prepared dataset, with the merge settings
    (on `host` when given: `workdir` is a path there)."""
    layout = RunLayout(Path(workdir))
    return Output(str(layout.merged_dir),
                  {d.name: str(layout.tokenized(d.name)) for d in cfg.datasets},
                  cfg.merge.model_dump(mode="json"), host=host)


_RETRY = retry_unless(*USER_ERRORS, RequestRejected)
"""Not retried: bad settings or data, and requests the server refused (401/403/404/405)."""


@task(name="resolve-target", retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE)
def resolve_target_task(cfg: PipelineConfig) -> str:
    """The target model folder (builds the tiny demo target once, cached on disk)."""
    return str(phases.resolve_target(cfg))


def _generation_progress(name: str) -> Any:
    """A callback for `generate_phase`'s progress: a progress artifact of the dataset."""
    artifact_id = create_progress_artifact(
        progress=0.0, key=f"generate-{name.lower().replace('_', '-')}"[:60],
        description=f"Phase 1: answers generated for {name}",
    )
    progress = ThrottledProgress(artifact_id, interval=2.0)
    return lambda p: progress(p.done, p.total)


def _done(stats: dict, what: str) -> Any:
    """`stats` as the task's result: a "Skipped" state when the phase found its output done."""
    if stats.get("skipped"):
        return skipped(stats, f"{what}: output already complete (manifest verifies)")
    return stats


@task(name="generate", task_run_name="generate-{name}", retries=2, retry_delay_seconds=[10, 60],
      retry_jitter_factor=0.5, retry_condition_fn=_RETRY, persist_result=True,
      cache_policy=VerifiedOutput(output=lambda p: generate_output(
          p["cfg"], p["workdir"], p["name"], p["model"])))
def generate_task(cfg: PipelineConfig, workdir: str, name: str, base_url: str, model: str) -> Any:
    """Phase 1 for one dataset. A retry requests only the ids still missing."""
    stats = phases.generate_phase(
        cfg, RunLayout(Path(workdir)), name, base_url=base_url, model=model,
        api_key=resolve_api_key(cfg.generation), on_progress=_generation_progress(name),
    )
    get_run_logger().info("generate %s: %s", name, stats)
    return _done(stats, f"generate {name}")


@task(name="tokenize", task_run_name="tokenize-{name}", retries=1, retry_delay_seconds=5,
      retry_condition_fn=_RETRY, persist_result=True,
      cache_policy=VerifiedOutput(output=lambda p: tokenize_output(
          p["cfg"], p["workdir"], p["name"], p["target_dir"])))
def tokenize_task(cfg: PipelineConfig, workdir: str, name: str, target_dir: str) -> Any:
    """Phase 2 for one dataset."""
    stats = phases.tokenize_phase(cfg, RunLayout(Path(workdir)), name, target_dir=Path(target_dir))
    get_run_logger().info("tokenize %s: %s", name, stats)
    return _done(stats, f"tokenize {name}")


@task(name="merge", task_run_name="merge", persist_result=True,
      cache_policy=VerifiedOutput(output=lambda p: merge_output(p["cfg"], p["workdir"])))
def merge_task(cfg: PipelineConfig, workdir: str) -> Any:
    """Phase 3: merge, truncate, shuffle and split every prepared dataset."""
    stats = phases.merge_phase(cfg, RunLayout(Path(workdir)))
    get_run_logger().info("merge: %s records, %s tokens", stats.get("records"), stats.get("tokens"))
    return _done(stats, "merge")

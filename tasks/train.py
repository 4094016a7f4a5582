"""Prefect tasks for phase 5 (drafter training): thin wrappers over `eyas.train.run`.

Tasks take the typed `PipelineConfig`, the workdir, the data kind and a `HostSpec` (plain
data). Training runs ``train.processes`` processes, by default one per GPU of the host (the
block's ``num_gpus``; here, what torch sees), at least one (`eyas.train.launch`), as
`eyas.train.job.TrainJob.run` decides: on a host a detached job (named after the flow run, so
that a cancelled flow's hook stops it), here in this process or as torchrun's agent, a child
that dies with this process.

Either way the step records of rank 0 come back as readable lines in the Prefect log and
move the progress artifact; other lines (another rank's error) are logged as they are. The run
holds one job slot of its host and a GPU slot per process (`training_slots`), and
resumes from ``<workdir>/drafter/checkpoint`` when one is there: a finished run is not
trained again.

Caching (`tasks.caching`): the task is keyed by its source, the training settings, the target's
config and the data it reads (the shards' manifests, or the merged files), and hits only while
``drafter/export`` verifies and ``drafter/trained_from.json`` records that very key's inputs
and settings. A training found finished for these settings (by its history and export) comes
back "Skipped" before it waits for a GPU slot. A checkpoint made with other settings or data
(`drafter/settings.json`) is never resumed: the old ``drafter/`` is moved aside to
``drafter.replaced-<time>/`` (kept, named in the log) and training starts afresh. What
makes a training, what may change under a resume and when one is finished:
`eyas.train.resume`.

Data (`eyas.train.run.data_paths`, read by `eyas.train.run.open_sources`):
- ``offline``: the extraction shards ``<workdir>/hidden/train`` (and ``hidden/eval`` when it
  holds shards) -- `eyas extract` makes them;
- ``online``: ``<workdir>/merged/train.jsonl`` and ``eval.jsonl``, the target running in the
  training process (small targets).
"""

from __future__ import annotations

import base64
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NO_CACHE

from eyas.config import PipelineConfig
from eyas.layout import RunLayout
from eyas.remote.hosts import HostSpec
from eyas.train import resume
from eyas.train import run as core
from eyas.train.job import TrainJob
from eyas.train.launch import resolve_processes
from eyas.train.report import evaluation_rows, summary_markdown, training_picture
from tasks import limits
from tasks.caching import Output, VerifiedOutput, input_checksums, skipped, stamp
from tasks.extract import target_path
from tasks.hosts import open_host
from tasks.jobs import flow_job_id
from tasks.progress import ThrottledProgress
from tasks.retries import USER_ERRORS, retry_unless


def _status(summary: dict, steps: int) -> str:
    if summary.get("resumed_from") is not None and summary["resumed_from"] >= steps:
        return "complete"  # found finished: nothing trained, export refreshed
    return "resumed" if summary.get("resumed_from") is not None else "trained"


def processes(cfg: PipelineConfig, host: HostSpec | None) -> int:
    """Training processes for this run: ``train.processes``, else one per GPU of the host
    (the block's ``num_gpus``; here, torch's count), 1 when training runs on the CPU."""
    if cfg.train.device == "cpu":
        return resolve_processes(cfg.train.processes, 0)
    with open_host(host) as h:
        return resolve_processes(cfg.train.processes, h.gpu_count())


@contextlib.contextmanager
def training_slots(spec: HostSpec, n: int) -> Iterator[None]:
    """Hold one job slot of the host and a GPU slot per training process: `n`, or every slot
    of the host's GPU pool when it has fewer (an operator may have lowered it)."""
    host_name, gpu_name = limits.host_pool_name(spec), limits.gpu_pool_name(spec)
    limits.ensure_pool(host_name, limits.HOST_JOBS)
    limits.ensure_pool(gpu_name, max(1, spec.num_gpus, n))
    size = limits.pool_size(gpu_name)
    with limits.hold_slots({host_name: 1}), limits.hold_slots({gpu_name: max(1, min(n, size))}):
        yield


# -- what a training is made of: the cache's output ---------------------------------------
def train_output(cfg: PipelineConfig, workdir: str, data: str,
                 host: HostSpec | None = None) -> Output:
    """The training's output for the cache: ``drafter/export``, from the data (the shards'
    manifests offline, the merged files online) and the target's config, with the training
    settings (`eyas.train.resume.train_settings`); its stamp ``drafter/trained_from.json``."""
    layout = RunLayout(Path(workdir))
    inputs = TrainJob.of(cfg, workdir, data, target_path(cfg, host), 1).inputs()
    return Output(str(layout.export), inputs, resume.train_settings(cfg, data),
                  host=host, stamp=str(layout.trained_from))


def _claim(cfg: PipelineConfig, workdir: str, data: str, host: HostSpec | None,
           n: int) -> dict | None:
    """`eyas.train.resume.claim` on the run's host, logging a ``drafter/`` moved aside: the
    finished summary, or None (also when the data is missing: training then says what is
    missing)."""
    data_hashes = input_checksums(train_output(cfg, workdir, data, host).inputs, host)
    if data_hashes is None:
        return None
    with open_host(host) as h:
        found = resume.claim(h, cfg, workdir, data, data_hashes, n)
    if found.moved_aside:
        get_run_logger().warning(
            "%s was trained with other settings or data: moved aside to %s (delete it with "
            "`eyas clean` when it is no longer wanted); training afresh",
            RunLayout(Path(workdir)).drafter_dir, found.moved_aside)
    return found.finished


# -- tasks ----------------------------------------------------------------------------------
@task(name="train-drafter", task_run_name="train-drafter-{data}", retries=1,
      retry_delay_seconds=[30], retry_jitter_factor=0.5,
      retry_condition_fn=retry_unless(*USER_ERRORS), persist_result=True,
      cache_policy=VerifiedOutput(output=lambda p: train_output(
          p["cfg"], p["workdir"], p["data"], p.get("host"))))
def train_task(cfg: PipelineConfig, workdir: str, data: str = "offline",
               host: HostSpec | None = None, progress_id: str | None = None) -> Any:
    """Train (or resume, or find finished) the drafter of `workdir` and export it.

    Returns `train_drafter`'s summary (``steps``, ``resumed_from``, ``export``, ``best``,
    ``draft_vocab_size``) plus ``status`` (trained / resumed / complete), ``history`` (the
    records of ``history.json``), ``processes`` and ``out``; a finished training comes back
    as a "Skipped" state before any GPU slot is taken. `progress_id` is a progress artifact
    moved as steps go by. Raises ConfigError for an unknown `data`, DataError when the data is
    missing.
    """
    core.check_data_kind(data)
    logger = get_run_logger()
    n = processes(cfg, host)
    with open_host(host) as h:
        steps = resume.planned_steps(cfg, workdir, h, n) or cfg.train.steps
    progress = ThrottledProgress(progress_id, steps, label="Drafter training: step")
    finished = _claim(cfg, workdir, data, host, n)
    if finished is not None:
        progress(steps)
        return skipped(finished, f"training finished at step {finished['steps']} with these "
                                 "settings (export verifies)")
    job = TrainJob.of(cfg, workdir, data, target_path(cfg, host), n)

    def on_record(record: dict) -> None:
        if record["kind"] == "train":
            progress(record["step"])

    with training_slots(host or HostSpec.local(data_root="/"), n), open_host(host) as h:
        summary = job.run(h, say=lambda line: logger.info("%s", line), on_record=on_record,
                          warn=lambda line: logger.warning("%s", line), job_id=flow_job_id)
    progress(summary["steps"])
    summary["status"] = _status(summary, steps)
    summary["processes"] = n
    summary["out"] = str(RunLayout(Path(workdir)).drafter_dir)
    if summary.get("export"):
        stamp(train_output(cfg, workdir, data, host))
    logger.info("training %s at step %s; export: %s", summary["status"], summary["steps"],
                summary["export"])
    return summary


@task(name="training-report", cache_policy=NO_CACHE)
def report_task(summary: dict, workdir: str, run_name: str, artifact_key: str,
                host: HostSpec | None = None) -> str:
    """Publish the run's artifacts: the picture of loss and acc_i over steps (PNG in
    ``<workdir>/reports/training.png``, on the host when remote, embedded in a markdown
    artifact), the final evaluation as a table, the export folder as a link.

    Returns the picture's path (on the host when remote).
    """
    history = summary.get("history") or []
    picture = RunLayout(Path(workdir)).training_picture
    md = summary_markdown(summary, history)
    with open_host(host) as h:
        on = h.on
        if history:
            with tempfile.TemporaryDirectory() as tmp:
                local = training_picture(history, Path(tmp) / "training.png", title=run_name)
                png = local.read_bytes()
                h.mkdir(str(picture.parent))
                h.put_file(local, str(picture))
        export_link = h.uri(summary["export"]) if summary.get("export") else None
    if history:
        b64 = base64.b64encode(png).decode()
        md += (f"\n![loss and per-step accuracy](data:image/png;base64,{b64})\n\n"
               f"Picture file: `{picture}`{on}\n")
    else:
        md += "\nNo history to draw (no step was logged).\n"
    create_markdown_artifact(md, key=f"{artifact_key}-summary",
                             description="Drafter training: loss and per-step accuracy")
    best = summary.get("best")
    if best:
        create_table_artifact(evaluation_rows(best), key=f"{artifact_key}-eval",
                              description=f"Final evaluation (step {best['step']}): acc_i and "
                              f"simulated acceptance length "
                              f"{best['simulated_acceptance_length']:.3f}")
    if export_link:
        create_link_artifact(export_link, link_text=str(summary["export"]),
                             key=f"{artifact_key}-export",
                             description="Exported SGLang EAGLE-3 drafter folder" + on)
    return str(picture)

"""The `train-drafter` flow: phase 5, train the EAGLE-3 drafter and export it for SGLang.

    progress artifact (moves with the steps, throttled) -> one training task on the host
    (one process per GPU, ``train.processes``, through torchrun; here in this process or
    as its child, over SSH a detached job with its log streamed; resumes from the run's
    checkpoint) -> picture of loss and per-step accuracy (markdown artifact), table of the
    final evaluation, link to the exported folder.

A rerun finds the finished training and trains nothing: the task comes back Cached, or
"Skipped" (status "complete") when its manifest and history say it is done, before it waits
for a GPU slot; an interrupted run resumes where its last checkpoint left it. Over SSH, a
restarted flow re-attaches to the training job its predecessor left running, and cancelling
the flow run stops that job. `train_stage` is the same stage inside the `eyas-pipeline` flow.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact

from blocks.gpu_host import GpuHost
from eyas import stopping
from eyas.config import PipelineConfig
from eyas.remote.hosts import HostSpec
from tasks.artifacts import artifact_key
from tasks.hosts import resolve_run, run_lock
from tasks.jobs import cancel_remote_jobs
from tasks.train import report_task, train_task

TrainingData = Literal["offline", "online"]
"""``offline``: extraction shards (``hidden/``); ``online``: merged JSONL, the target in process."""


@flow(name="train-drafter", log_prints=True, on_cancellation=[cancel_remote_jobs])
def train_drafter_flow(
    config: PipelineConfig,
    workdir: str,
    host_block: GpuHost | None = None,
    data: TrainingData = "offline",
) -> dict[str, Any]:
    """Train the drafter of a run into ``<workdir>/drafter/`` and export it to ``export/``.

    Args:
        config: the pipeline configuration (its ``train`` section, target and ``extract``
            layers); a recipe's path is loaded here.
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: a saved ``GpuHost`` block (picked in the UI, or its name); training then runs there as a detached
            job (``python -m eyas.train.run``) with its log streamed here. None: this machine.
        data: ``offline`` (extraction shards in ``hidden/train`` and ``hidden/eval``) or
            ``online`` (``merged/train.jsonl`` and ``eval.jsonl``, the target run in process).

    Returns the summary: status (trained / resumed / complete), steps, processes, best evaluation,
    ``simulated_acceptance_length``, ``export`` (the SGLang folder) and ``picture``.
    Raises ConfigError for an unknown `data`, DataError when the data is missing.
    """
    stopping.watch()  # a deployment's run: a cancel's SIGTERM reaches the tasks
    from eyas.train.run import check_data_kind

    check_data_kind(data)
    workdir, host = resolve_run(workdir, host_block, config.gpu_env)
    with run_lock(workdir, host, "train-drafter"):
        return train_stage(config, workdir, host, data)


def train_stage(cfg: PipelineConfig, workdir: str, host: HostSpec | None, data: str,
                wait_for: list[Any] | None = None) -> dict[str, Any]:
    """Phase 5 inside the running flow: the training task, then its artifacts."""
    logger = get_run_logger()
    key = artifact_key("train", cfg.name)
    progress = create_progress_artifact(0.0, key=f"{key}-progress",
                                        description="Drafter training: " + (
                                            f"{cfg.train.epochs:g} epochs"
                                            if cfg.train.epochs is not None
                                            else f"{cfg.train.steps} steps"))
    future = train_task.submit(cfg, workdir, data, host, str(progress), wait_for=wait_for or [])
    summary = future.result()
    if future.state.name == "Cached":  # nothing trained in this run: found finished
        summary = {**summary, "status": "complete", "resumed_from": summary["steps"]}
    picture = report_task(summary, workdir, cfg.name, key, host)
    best = summary.get("best") or {}
    result = {k: v for k, v in summary.items() if k != "history"}
    result.update(picture=picture, data=data, host=host.login if host else "local",
                  simulated_acceptance_length=best.get("simulated_acceptance_length"))
    logger.info("drafter %s: simulated acceptance length %s; export %s", result["status"],
                result["simulated_acceptance_length"], result["export"])
    return result

"""The `train-drafter` flow: phase 5, train the EAGLE-3 drafter and export it for SGLang.

    progress artifact (moves with the steps, throttled) -> one training task on the host
    (one process per GPU, ``train.processes``, through torchrun; here in this process or
    as its child, over SSH a detached job with its log streamed; resumes from the run's
    checkpoint) -> picture of loss and per-step accuracy (markdown artifact), table of the
    final evaluation, link to the exported folder.

A rerun finds the finished checkpoint and trains nothing (status "complete"); an interrupted
run resumes where its last checkpoint left it. Over SSH, a restarted flow re-attaches to the
training job its predecessor left running, and cancelling the flow run stops that job.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact

from eyas.config import load_config
from eyas.train.run import check_data_kind
from tasks.artifacts import artifact_key
from tasks.hosts import resolve_run
from tasks.jobs import cancel_remote_jobs
from tasks.train import report_task, train_task


@flow(name="train-drafter", log_prints=True, on_cancellation=[cancel_remote_jobs])
def train_drafter_flow(
    config_path: str,
    workdir: str,
    host_block: str | None = None,
    data: str = "offline",
) -> dict[str, Any]:
    """Train the drafter of a run into ``<workdir>/drafter/`` and export it to ``export/``.

    Args:
        config_path: the pipeline YAML (its ``train`` section, target and ``extract`` layers).
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: name of a saved ``GpuHost`` block; training then runs there as a detached
            job (``python -m eyas.train.run``) with its log streamed here. None: this machine.
        data: ``offline`` (extraction shards in ``hidden/train`` and ``hidden/eval``) or
            ``online`` (``merged/train.jsonl`` and ``eval.jsonl``, the target run in process).

    Returns the summary: status (trained / resumed / complete), steps, processes, best evaluation,
    ``simulated_acceptance_length``, ``export`` (the SGLang folder) and ``picture``.
    Raises ConfigError for an unknown `data`, DataError when the data is missing.
    """
    check_data_kind(data)
    logger = get_run_logger()
    config_path, workdir, host = resolve_run(config_path, workdir, host_block)
    cfg = load_config(config_path)
    key = artifact_key("train", cfg.name)
    progress = create_progress_artifact(0.0, key=f"{key}-progress",
                                        description=f"Drafter training: {cfg.train.steps} steps")
    summary = train_task(config_path, workdir, data, host, str(progress))
    picture = report_task(summary, workdir, cfg.name, key, host)
    best = summary.get("best") or {}
    result = {k: v for k, v in summary.items() if k != "history"}
    result.update(picture=picture, data=data, host=host.login if host else "local",
                  simulated_acceptance_length=best.get("simulated_acceptance_length"))
    logger.info("drafter %s: simulated acceptance length %s; export %s", result["status"],
                result["simulated_acceptance_length"], result["export"])
    return result

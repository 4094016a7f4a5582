"""The `eyas-pipeline` flow: the users' between-phase routine as one run.

    probe-status ─┬─ merge (on the host) ──┐
                  └─ clean old outputs ────┴─ probe-status (disk re-checked)
                                               ─ extract train, eval ─ train   (when asked)

The merge and the deletion of an old run's hidden states touch disjoint paths, so they run
at the same time; whatever comes next waits for both, then sees the disk as it is after the
deletion. Work on the host is bounded by its concurrency limits (`tasks.limits`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from eyas.config import load_config
from eyas.errors import EyasError
from tasks.hosts import host_spec
from tasks.jobs import cancel_remote_jobs
from tasks.prepare import merge_task
from tasks.remote import clean_task, prepare_on_host_task, status_task


@flow(name="eyas-pipeline", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True,
      on_cancellation=[cancel_remote_jobs])
def run_pipeline(
    config_path: str,
    workdir: str,
    host_block: str | None = None,
    data_root: str | None = None,
    clean_paths: list[str] | None = None,
    confirm_clean: bool = False,
    then: list[str] | None = None,
) -> dict[str, Any]:
    """Probe the host, then merge while deleting obsolete outputs, then probe again.

    Args:
        config_path: the pipeline YAML (on the machine running the flow).
        workdir: the run's folder on the host (its ``prepared/`` must be complete).
        host_block: a saved `GpuHost` block; none means this machine.
        data_root: overrides the host's data root (the only place deletion may touch).
        clean_paths: obsolete outputs to delete, e.g. an old run's ``hidden/``.
        confirm_clean: really delete; without it the deletion is a dry run.
        then: later phases to run once both are done, in order: ``extract`` (hidden states of
            the train and eval splits; refuses to start without the disk it needs) and
            ``train`` (the drafter, from those shards).
    """
    logger = get_run_logger()
    load_config(config_path)  # a bad config fails here, before any work on the host
    spec = host_spec(host_block, data_root)
    before = status_task(spec, workdir, config_path)
    if before.get("fits") is False:
        logger.warning("before deletion, the next phase does not fit: %s", before.get("refusal"))

    if spec.kind == "local":
        merge = merge_task.submit(str(Path(config_path).resolve()), workdir)
    else:
        merge = prepare_on_host_task.submit(spec, "merge", str(Path(config_path).resolve()),
                                            workdir)
    futures = {"merge": merge}
    if clean_paths:
        futures["clean"] = clean_task.submit(spec, list(clean_paths), [workdir], confirm_clean)
    wait(list(futures.values()))
    failed = {k: f.state.message for k, f in futures.items() if not f.state.is_completed()}
    if failed:
        raise EyasError("; ".join(f"{k} failed: {m}" for k, m in failed.items()))

    # Free space is re-checked once the old data is gone.
    after = status_task.submit(spec, workdir, config_path, wait_for=list(futures.values())).result()
    result = {k: f.result() for k, f in futures.items()} | {"status_before": before, "status_after": after}

    later = list(then or [])
    unknown = sorted(set(later) - {"extract", "train"})
    if unknown:
        raise EyasError(f"unknown phases in `then`: {unknown}; choose from ['extract', 'train']")
    if "extract" in later:
        from flows.extract import extract_hidden_states

        result["extract"] = extract_hidden_states(config_path, workdir, host_block)
    if "train" in later:
        from flows.train import train_drafter_flow

        result["train"] = train_drafter_flow(config_path, workdir, host_block)
    return result

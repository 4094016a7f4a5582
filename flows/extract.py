"""The `extract-hidden-states` flow: phase 4, one Prefect task per shard.

    plan (where the data is) -> disk plan + refusal (markdown artifact) -> one task per shard,
    submitted at once to a bounded thread pool and gated by the host's GPU concurrency limit
    (``eyas-gpu-<host>``, created with one slot per GPU when missing) -> progress artifact
    moving as shards finish -> table of shard states + actual vs estimated bytes.

A rerun skips every shard whose manifest verifies (the task reports it "skipped");
``only_failed=True`` does not even submit those: only missing, interrupted, corrupted or
stale shards run. A failed shard retries with backoff and jitter (not for configuration or
disk errors); the flow then fails, naming the shards, after publishing the table.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.futures import as_completed, wait
from prefect.task_runners import ThreadPoolTaskRunner

from eyas.config import load_config
from eyas.errors import EyasError
from eyas.extract.plan import estimate_bytes, human_bytes
from tasks.artifacts import artifact_key
from tasks.extract import disk_task, gpu_count, gpu_limit_name, plan_task, shard_task
from tasks.jobs import cancel_remote_jobs
from tasks.limits import ensure_limit
from tasks.remote import resolve_run

MAX_WORKERS = 16
"""Threads submitting shards; the GPU concurrency limit decides how many actually run."""


@flow(name="extract-hidden-states", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),
      log_prints=True, on_cancellation=[cancel_remote_jobs])
def extract_hidden_states(
    config_path: str,
    workdir: str,
    host_block: str | None = None,
    split: str = "train",
    only_failed: bool = False,
    shards: list[int] | None = None,
    retries: int = 2,
    retry_delay_seconds: list[float] | None = None,
) -> dict[str, Any]:
    """Extract the hidden states of ``<workdir>/merged/<split>.jsonl`` into
    ``<workdir>/hidden/<split>/``, one task per shard.

    Args:
        config_path: the pipeline YAML (its ``extract`` section and target).
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: name of a saved ``GpuHost`` block; each shard then runs there as a
            detached job with its log streamed here. None: this machine.
        split: ``train`` or ``eval``.
        only_failed: submit only shards that are not complete (missing, failed, corrupted).
        shards: only these shard indices (default: all).
        retries: retries of a failed shard.
        retry_delay_seconds: backoff before each retry (default [30, 120]), with 50 % jitter.

    Returns the summary: per-shard rows, totals, estimated and actual bytes. Raises EyasError
    after the artifacts are published when a shard failed; DiskSpaceError before any work.
    """
    logger = get_run_logger()
    config_path, workdir, host = resolve_run(config_path, workdir, host_block)
    cfg = load_config(config_path)
    key = artifact_key("extract", cfg.name, split)

    plan = plan_task(config_path, workdir, split, host, shards)
    disk_task(plan, split, cfg.extract.disk_margin, host.login if host else "local", key)

    limit = gpu_limit_name(host)
    ensure_limit(limit, gpu_count(host))  # one slot per GPU unless the operator set it already
    todo = set(plan["todo"])
    specs = [s for s in plan["specs"] if s["index"] in todo] if only_failed else plan["specs"]
    logger.info("%d shard(s) to submit (%d already complete%s)", len(specs),
                len(plan["specs"]) - len(todo), ", left out" if only_failed else ", will be skipped")

    progress = create_progress_artifact(0.0, key=f"{key}-progress",
                                        description=f"Shards of {split} finished")
    task = shard_task.with_options(retries=retries,
                                   retry_delay_seconds=retry_delay_seconds or [30, 120])
    futures = {s["index"]: task.submit(config_path, workdir, split, s, plan["model_dir"], host)
               for s in specs}
    for done, _ in enumerate(as_completed(list(futures.values())), start=1):
        update_progress_artifact(progress, progress=100.0 * done / max(1, len(futures)))
    wait(list(futures.values()))
    if not futures:
        update_progress_artifact(progress, progress=100.0)

    by_index = {s["index"]: s for s in plan["specs"]}
    rows, failed = [], []
    for index, fut in sorted(futures.items()):
        spec = by_index[index]
        est = estimate_bytes(spec["num_tokens"], spec["num_samples"], 1, plan["hidden_size"],
                             cfg.extract.storage, dtype=cfg.extract.dtype, topk=cfg.extract.topk)
        if fut.state.is_completed():
            r = fut.result()
            rows.append({"shard": r["shard"], "samples": r["samples"], "tokens": r["tokens"],
                         "status": r["status"], "quarantined": r["quarantined"],
                         "bytes": r["bytes"], "estimated_bytes": est, "message": ""})
        else:
            msg = (fut.state.message or fut.state.name).splitlines()[0][:200]
            failed.append(f"shard {index:05d}: {msg}")
            rows.append({"shard": f"shard-{index:05d}", "samples": spec["num_samples"],
                         "tokens": spec["num_tokens"], "status": "failed", "quarantined": 0,
                         "bytes": 0, "estimated_bytes": est, "message": msg})
    ok = [r for r in rows if r["status"] != "failed"]
    actual = sum(r["bytes"] for r in ok)
    estimated = sum(r["estimated_bytes"] for r in ok)
    summary = {
        "split": split, "storage": cfg.extract.storage, "host": host.login if host else "local",
        "out": plan["out"], "shards": rows, "num_shards": len(rows),
        "extracted": sum(r["status"] == "extracted" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "failed": len(failed), "left_out_complete": len(plan["specs"]) - len(specs),
        "samples": sum(r["samples"] for r in ok), "tokens": sum(r["tokens"] for r in ok),
        "estimated_bytes": estimated, "actual_bytes": actual,
        "actual_over_estimate": round(actual / estimated, 4) if estimated else None,
    }
    create_table_artifact(rows, key=f"{key}-shards",
                          description=f"Shard states, {split} ({summary['host']})")
    create_markdown_artifact(
        f"## Extraction {split}: {len(ok)}/{len(rows)} shard(s) done\n\n"
        f"| | |\n|---|---|\n| extracted / skipped / failed | {summary['extracted']} / "
        f"{summary['skipped']} / {len(failed)} |\n| samples / tokens | {summary['samples']:,} / "
        f"{summary['tokens']:,} |\n| actual bytes | {human_bytes(actual)} ({actual:,}) |\n"
        f"| estimated bytes | {human_bytes(estimated)} ({estimated:,}) |\n"
        f"| actual / estimated | {summary['actual_over_estimate']} |\n",
        key=f"{key}-bytes", description=f"Actual vs estimated bytes, {split}")
    if failed:
        for line in failed:
            logger.error(line)
        raise EyasError(f"{len(failed)} shard(s) failed; rerun with only_failed=True to redo only "
                        "those (complete shards are kept):\n  " + "\n  ".join(failed))
    return summary

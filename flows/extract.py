"""The `extract-hidden-states` flow: phase 4, one Prefect task per shard, for each split.

    per split (train, then eval): plan (where the data is) -> disk plan + refusal (markdown
    artifact) -> one task per shard, submitted at once to a bounded thread pool and gated by
    the host's GPU concurrency limit (``eyas-gpu-<host>``, created with one slot per GPU when
    missing) -> progress artifact moving as shards finish -> table of shard states + actual vs
    estimated bytes.

A rerun skips every shard whose manifest verifies (the task reports it "skipped");
``only_failed=True`` does not even submit those: only missing, interrupted, corrupted or
stale shards run. A failed shard retries with backoff and jitter (not for configuration or
disk errors); the flow then fails, naming the shards, after publishing every split's table.
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

from eyas.config import PipelineConfig, load_config
from eyas.disk import human_bytes
from eyas.errors import ConfigError, EyasError
from eyas.extract.run import shard_estimate, summarize
from eyas.layout import SPLITS
from eyas.remote.hosts import HostSpec
from tasks.artifacts import artifact_key
from tasks.extract import (
    SHARD_RETRIES,
    SHARD_RETRY_DELAYS,
    disk_task,
    gpu_count,
    gpu_spec,
    plan_task,
    shard_task,
)
from tasks.hosts import resolve_run
from tasks.jobs import cancel_remote_jobs
from tasks.limits import ensure_limit, gpu_limit_name

MAX_WORKERS = 16
"""Threads submitting shards; the GPU concurrency limit decides how many actually run."""


@flow(name="extract-hidden-states", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),
      log_prints=True, on_cancellation=[cancel_remote_jobs])
def extract_hidden_states(
    config_path: str,
    workdir: str,
    host_block: str | None = None,
    splits: list[str] | None = None,
    only_failed: bool = False,
    shards: list[int] | None = None,
    retries: int = SHARD_RETRIES,
    retry_delay_seconds: list[float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Extract the hidden states of ``<workdir>/merged/<split>.jsonl`` into
    ``<workdir>/hidden/<split>/``, one task per shard, for each split.

    Args:
        config_path: the pipeline YAML (its ``extract`` section and target).
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: name of a saved ``GpuHost`` block; each shard then runs there as a
            detached job with its log streamed here. None: this machine.
        splits: which of ``train`` and ``eval`` (default: both; training evaluates on eval).
        only_failed: submit only shards that are not complete (missing, failed, corrupted).
        shards: only these shard indices, in each split (default: all).
        retries: retries of a failed shard.
        retry_delay_seconds: backoff before each retry (default [30, 120]), with 50 % jitter.

    Returns ``{split: summary}``: per-shard rows, totals, estimated and actual bytes. Raises
    EyasError after the artifacts are published when a shard failed; DiskSpaceError before
    any work of a split that does not fit.
    """
    splits = list(splits or SPLITS)
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise ConfigError(f"unknown splits {unknown}; choose from {list(SPLITS)}", where="splits")
    config_path, workdir, host = resolve_run(config_path, workdir, host_block)
    cfg = load_config(config_path)
    # One slot per GPU unless the operator set the limit already.
    ensure_limit(gpu_limit_name(gpu_spec(host)), gpu_count(host))
    task = shard_task.with_options(retries=retries,
                                   retry_delay_seconds=retry_delay_seconds or SHARD_RETRY_DELAYS)
    results, failed = {}, []
    for split in splits:
        results[split], errors = _extract_split(cfg, config_path, workdir, host, split, task,
                                                only_failed=only_failed, shards=shards)
        failed += errors
    if failed:
        logger = get_run_logger()
        for line in failed:
            logger.error(line)
        raise EyasError(f"{len(failed)} shard(s) failed; rerun with only_failed=True to redo only "
                        "those (complete shards are kept):\n  " + "\n  ".join(failed))
    return results


def _extract_split(cfg: PipelineConfig, config_path: str, workdir: str, host: HostSpec | None,
                   split: str, task: Any, *, only_failed: bool,
                   shards: list[int] | None) -> tuple[dict[str, Any], list[str]]:
    """One split: plan, disk check, its shards; returns its summary and the failures."""
    logger = get_run_logger()
    key = artifact_key("extract", cfg.name, split)
    plan = plan_task(config_path, workdir, split, host, shards)
    disk_task(plan, split, cfg.extract.disk_margin, host.login if host else "local", key)

    todo = set(plan["todo"])
    specs = [s for s in plan["specs"] if s["index"] in todo] if only_failed else plan["specs"]
    logger.info("%s: %d shard(s) to submit (%d already complete%s)", split, len(specs),
                len(plan["specs"]) - len(todo), ", left out" if only_failed else ", will be skipped")

    progress = create_progress_artifact(0.0, key=f"{key}-progress",
                                        description=f"Shards of {split} finished")
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
        est = shard_estimate(spec["num_tokens"], spec["num_samples"], plan["hidden_size"],
                             cfg.extract)
        if fut.state.is_completed():
            r = fut.result()
            rows.append({"shard": r["shard"], "samples": r["samples"], "tokens": r["tokens"],
                         "status": r["status"], "quarantined": r["quarantined"],
                         "bytes": r["bytes"], "estimated_bytes": est, "message": ""})
        else:
            msg = (fut.state.message or fut.state.name).splitlines()[0][:200]
            failed.append(f"{split} shard {index:05d}: {msg}")
            rows.append({"shard": f"shard-{index:05d}", "samples": spec["num_samples"],
                         "tokens": spec["num_tokens"], "status": "failed", "quarantined": 0,
                         "bytes": 0, "estimated_bytes": est, "message": msg})
    summary = {"split": split, "storage": cfg.extract.storage,
               "host": host.login if host else "local", "out": plan["out"], "shards": rows,
               "left_out_complete": len(plan["specs"]) - len(specs), **summarize(rows)}
    create_table_artifact(rows, key=f"{key}-shards",
                          description=f"Shard states, {split} ({summary['host']})")
    actual, estimated = summary["actual_bytes"], summary["estimated_bytes"]
    create_markdown_artifact(
        f"## Extraction {split}: {len(rows) - summary['failed']}/{len(rows)} shard(s) done\n\n"
        f"| | |\n|---|---|\n| extracted / skipped / failed | {summary['extracted']} / "
        f"{summary['skipped']} / {summary['failed']} |\n| samples / tokens | "
        f"{summary['samples']:,} / {summary['tokens']:,} |\n"
        f"| actual bytes | {human_bytes(actual)} ({actual:,}) |\n"
        f"| estimated bytes | {human_bytes(estimated)} ({estimated:,}) |\n"
        f"| actual / estimated | {summary['actual_over_estimate']} |\n",
        key=f"{key}-bytes", description=f"Actual vs estimated bytes, {split}")
    return summary, failed

"""The `extract-hidden-states` flow: phase 4, one Prefect task per shard, both splits at once.

    plan train ∥ plan eval (where the data is) -> one disk check for both (markdown artifact;
    refuses before any work) -> one task per shard of every split, submitted at once to a
    bounded thread pool and gated by the host's GPU concurrency limit (``eyas-gpu-<host>``,
    created with one slot per GPU when missing): the splits run side by side where the host
    has the GPUs -> per split: a progress artifact moving as shards finish, a table of every
    shard's state, actual vs estimated bytes.

A shard whose manifest verifies comes back "Skipped" at once, without waiting for a GPU slot;
``only_failed=True`` does not even submit those (the table still lists them). A failed shard
retries with backoff and jitter (not for configuration or disk errors); the flow then fails,
naming the shards, after publishing every split's artifacts. `extract_splits` is the same
stage inside the `eyas-pipeline` flow.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.futures import as_completed, wait
from prefect.task_runners import ThreadPoolTaskRunner

from blocks.gpu_host import GpuHost
from eyas.config import PipelineConfig
from eyas.disk import human_bytes
from eyas.errors import EyasError
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

Split = Literal["train", "eval"]
"""A split of the merged data (``merged/<split>.jsonl`` -> ``hidden/<split>/``)."""


@flow(name="extract-hidden-states", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),
      log_prints=True, on_cancellation=[cancel_remote_jobs])
def extract_hidden_states(
    config: PipelineConfig,
    workdir: str,
    host_block: GpuHost | None = None,
    splits: list[Split] | None = None,
    only_failed: bool = False,
    shards: list[int] | None = None,
    retries: int = SHARD_RETRIES,
    retry_delay_seconds: list[float] | None = None,
) -> dict[str, dict[str, Any]]:
    """Extract the hidden states of ``<workdir>/merged/<split>.jsonl`` into
    ``<workdir>/hidden/<split>/``, one task per shard, every split at once.

    Args:
        config: the pipeline configuration (its ``extract`` section and target); a recipe's
            path is loaded here.
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: a saved ``GpuHost`` block (picked in the UI, or its name); each shard then runs there as a
            detached job with its log streamed here. None: this machine.
        splits: which of ``train`` and ``eval`` (default: both; training evaluates on eval).
        only_failed: submit only shards that are not complete (missing, failed, corrupted).
        shards: only these shard indices, in each split (default: all).
        retries: retries of a failed shard.
        retry_delay_seconds: backoff before each retry (default [30, 120]), with 50 % jitter.

    Returns ``{split: summary}``: per-shard rows, totals, estimated and actual bytes. Raises
    EyasError after the artifacts are published when a shard failed; DiskSpaceError before
    any work when the splits do not fit.
    """
    workdir, host = resolve_run(workdir, host_block)
    results, failed = extract_splits(config, workdir, host, splits=splits,
                                     only_failed=only_failed, shards=shards, retries=retries,
                                     retry_delay_seconds=retry_delay_seconds)
    raise_failed_shards(failed)
    return results


def raise_failed_shards(failed: list[str]) -> None:
    """Log each failed shard and raise EyasError naming them (nothing when none failed)."""
    if not failed:
        return
    logger = get_run_logger()
    for line in failed:
        logger.error(line)
    raise EyasError(f"{len(failed)} shard(s) failed; rerun (or run the `extract-retry-failed` "
                    "deployment) to redo only those, complete shards are kept:\n  "
                    + "\n  ".join(failed))


def extract_splits(cfg: PipelineConfig, workdir: str, host: HostSpec | None, *,
                   splits: list[str] | None = None, only_failed: bool = False,
                   shards: list[int] | None = None, retries: int = SHARD_RETRIES,
                   retry_delay_seconds: list[float] | None = None,
                   wait_for: list[Any] | None = None) -> tuple[dict[str, dict], list[str]]:
    """Phase 4 inside the running flow: plan every split, check the disk for all of them,
    run their shards side by side, publish each split's artifacts.

    Returns ``({split: summary}, failures)``; raises DiskSpaceError (from the disk check)
    before any shard runs when the splits do not fit.
    """
    splits = list(dict.fromkeys(splits or SPLITS))
    # One slot per GPU unless the operator set the limit already.
    ensure_limit(gpu_limit_name(gpu_spec(host)), gpu_count(host))
    task = shard_task.with_options(retries=retries,
                                   retry_delay_seconds=retry_delay_seconds or SHARD_RETRY_DELAYS)
    key = artifact_key("extract", cfg.name)
    plan_futures = {s: plan_task.submit(cfg, workdir, s, host, shards, wait_for=wait_for or [])
                    for s in splits}
    plans = {s: f.result() for s, f in plan_futures.items()}
    disk_task(plans, cfg.extract.disk_margin, host.login if host else "local", key)

    logger = get_run_logger()
    futures: dict[Any, tuple[str, dict]] = {}
    progress: dict[str, Any] = {}
    for split, plan in plans.items():
        todo = set(plan["todo"])
        specs = [s for s in plan["specs"] if s["index"] in todo] if only_failed else plan["specs"]
        logger.info("%s: %d shard(s) to submit (%d already complete%s)", split, len(specs),
                    len(plan["specs"]) - len(todo),
                    ", left out" if only_failed else ", reported skipped")
        progress[split] = create_progress_artifact(
            _percent(len(plan["specs"]) - len(todo), len(plan["specs"])),
            key=f"{artifact_key('extract', cfg.name, split)}-progress",
            description=f"Shards of {split} complete")
        for s in specs:
            complete = plan.get("complete", {}).get(str(s["index"]))
            fut = task.submit(cfg, workdir, split, s, plan["model_dir"], host, complete)
            futures[fut] = (split, s)

    done = {s: len(p["specs"]) - len(p["todo"]) for s, p in plans.items()}
    for fut in as_completed(list(futures)):
        split, spec = futures[fut]
        fut.wait()  # its final state, not the server's view of it (which may lag)
        if fut.state.is_completed() and str(spec["index"]) not in plans[split].get("complete", {}):
            done[split] += 1
            update_progress_artifact(progress[split],
                                     _percent(done[split], len(plans[split]["specs"])))
    wait(list(futures))

    results, failed = {}, []
    for split, plan in plans.items():
        mine = {spec["index"]: fut for fut, (s, spec) in futures.items() if s == split}
        summary, errors = _split_summary(cfg, plan, split, mine, host)
        results[split] = summary
        failed += errors
    return results, failed


def _percent(done: int, total: int) -> float:
    return 100.0 * done / total if total else 100.0


def _split_summary(cfg: PipelineConfig, plan: dict, split: str, futures: dict[int, Any],
                   host: HostSpec | None) -> tuple[dict[str, Any], list[str]]:
    """One split's rows (every selected shard: run, skipped, or complete and left out),
    totals and artifacts; returns its summary and the failures."""
    key = artifact_key("extract", cfg.name, split)
    rows, failed = [], []
    for spec in plan["specs"]:
        index = spec["index"]
        est = shard_estimate(spec["num_tokens"], spec["num_samples"], plan["hidden_size"],
                             cfg.extract)
        fut = futures.get(index)
        if fut is None:  # complete, left out by only_failed
            r = plan["complete"][str(index)]
            rows.append({**_row(r, est), "status": "complete"})
        elif fut.state.is_completed():
            rows.append(_row(fut.result(), est))
        else:
            msg = (fut.state.message or fut.state.name).splitlines()[0][:200]
            failed.append(f"{split} shard {index:05d}: {msg}")
            rows.append({"shard": f"shard-{index:05d}", "samples": spec["num_samples"],
                         "tokens": spec["num_tokens"], "status": "failed", "quarantined": 0,
                         "bytes": 0, "estimated_bytes": est, "message": msg})
    where = host.login if host else "local"
    totals = summarize([{**r, "status": "skipped" if r["status"] == "complete" else r["status"]}
                        for r in rows])
    summary = {"split": split, "storage": cfg.extract.storage, "host": where, "out": plan["out"],
               "shards": [r for r in rows if r["status"] != "complete"],
               "left_out_complete": sum(r["status"] == "complete" for r in rows), **totals}
    create_table_artifact(rows, key=f"{key}-shards", description=f"Shard states, {split} ({where})")
    actual, estimated = summary["actual_bytes"], summary["estimated_bytes"]
    create_markdown_artifact(
        f"## Extraction {split}: {len(rows) - summary['failed']}/{len(rows)} shard(s) done\n\n"
        f"| | |\n|---|---|\n| extracted / skipped (complete) / failed | {summary['extracted']}"
        f" / {summary['skipped']} / {summary['failed']} |\n| samples / tokens | "
        f"{summary['samples']:,} / {summary['tokens']:,} |\n"
        f"| actual bytes | {human_bytes(actual)} ({actual:,}) |\n"
        f"| estimated bytes | {human_bytes(estimated)} ({estimated:,}) |\n"
        f"| actual / estimated | {summary['actual_over_estimate']} |\n",
        key=f"{key}-bytes", description=f"Actual vs estimated bytes, {split}")
    return summary, failed


def _row(result: dict, estimated: int) -> dict[str, Any]:
    return {"shard": result["shard"], "samples": result["samples"], "tokens": result["tokens"],
            "status": result["status"], "quarantined": result["quarantined"],
            "bytes": result["bytes"], "estimated_bytes": estimated, "message": ""}

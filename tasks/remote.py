"""Prefect tasks that act on a host (this machine or a GPU host over SSH).

Tasks receive a `HostSpec` (plain data) and open their own connection; a Fabric
Connection never crosses a task boundary. Every remote task holds a slot of the host's
job slot pool (`tasks.limits`). Artifact keys name the run and the host
(`host_artifact_key`), so two runs or two hosts never overwrite each other's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from eyas.config import PipelineConfig
from eyas.disk import human_bytes
from eyas.errors import RemoteError
from eyas.prepare import phases
from eyas.remote.clean import execute_clean, plan_clean, wait_for_running_deletions
from eyas.remote.host_check import needs_for
from eyas.remote.hosts import HostSpec, connect
from eyas.remote.jobs import last_json_line
from eyas.remote.probe import hidden_size_from_config, shard_expectation, status
from tasks.artifacts import artifact_key
from tasks.caching import VerifiedOutput, skipped
from tasks.jobs import run_remote_job
from tasks.limits import host_slot
from tasks.prepare import merge_output


def host_artifact_key(what: str, run_name: str, spec: HostSpec) -> str:
    """``<what>-<run>-<host>``: e.g. ``status-tiny-demo-local``, ``clean-kimi-192-0-2-10-22``."""
    where = "local" if spec.kind == "local" else f"{spec.host}-{spec.port}"
    return artifact_key(what, run_name, where)


@task(name="probe-status", retries=2, retry_delay_seconds=[5, 30], cache_policy=NO_CACHE)
def status_task(spec: HostSpec, workdir: str, cfg: PipelineConfig) -> dict:
    """What is complete, partial or missing in `workdir` on the host, what comes next,
    whether it fits on the host's disk (sized by the config's extraction storage), and what
    the host's interpreter, glibc and driver lack for the run (reported, not fatal)."""
    with host_slot(spec), connect(spec) as host:
        report = status(host, workdir, expected=[d.name for d in cfg.datasets],
                        generated=[d.name for d in cfg.datasets if d.regenerate],
                        shards=shard_expectation(cfg),
                        hidden_size=hidden_size_from_config(cfg), storage=cfg.extract.storage,
                        topk=cfg.extract.topk, dtype=cfg.extract.dtype,
                        host_needs=needs_for(["sglang"] if cfg.extract.backend == "sglang"
                                             else None))
    get_run_logger().info("status on %s:\n%s", spec.login, report.text())
    create_table_artifact(report.rows(), key=host_artifact_key("status", cfg.name, spec),
                          description=f"Outputs in {spec.login}:{workdir}")
    return report.to_dict()


@task(name="clean", retries=0, cache_policy=NO_CACHE)
def clean_task(spec: HostSpec, paths: list[str], in_use: list[str], confirm: bool,
               run_name: str = "eyas") -> dict:
    """Delete obsolete outputs on the host (a dry run unless `confirm`); report bytes freed.

    No retries: a deletion is irreversible, and its guards are re-checked on every call.
    """
    logger = get_run_logger()
    with host_slot(spec), connect(spec) as host:
        wait_for_running_deletions(host, logger.info)  # one an earlier run left going
        plan = plan_clean(host, paths, data_root=spec.data_root, in_use=in_use)
        logger.info("%s", plan.text())
        report = execute_clean(host, plan, confirm=confirm, say=logger.info)
    logger.info("%s", report.text())
    create_markdown_artifact(
        f"# Clean on `{spec.login}`\n\n```\n{plan.text()}\n\n{report.text()}\n```\n",
        key=host_artifact_key("clean", run_name, spec), description="Deletion of obsolete outputs",
    )
    if report.refused:
        raise RemoteError(
            "refused to delete: " + "; ".join(f"{p} ({why})" for p, why in report.refused)
        )
    return {"dry_run": report.dry_run, "deleted": report.deleted, "bytes_freed": report.bytes_freed,
            "freed": human_bytes(report.bytes_freed)}


def _on_host_output(params: dict[str, Any]):
    if params["phase"] != "merge":
        return None  # tokenize on a host: its own manifests skip what is done
    return merge_output(params["cfg"], params["workdir"], host=params["spec"])


@task(name="prepare-on-host", task_run_name="{phase}-on-host", retries=1, retry_delay_seconds=30,
      persist_result=True, cache_policy=VerifiedOutput(output=_on_host_output))
def prepare_on_host_task(spec: HostSpec, phase: str, cfg: PipelineConfig, workdir: str,
                         datasets: list[str] | None = None) -> Any:
    """Run a data-preparation phase (``python -m eyas.prepare <phase>``, with the host's eyas
    interpreter) on the host as a detached job; `datasets` limits ``tokenize`` to those.

    The config is written next to the run on the host; the job's log streams into this task's
    log; a dropped connection does not stop the job (`attach` reconnects), and cancelling or
    interrupting the task cancels it. Returns the phase's JSON result (a "Skipped" state when
    the host found the output already complete).
    """
    logger = get_run_logger()
    suffix = f"-{'-'.join(datasets)}"[:40] if datasets else ""
    remote_cfg = f"{workdir.rstrip('/')}/.eyas/config-{phase}{suffix}.yaml"
    with connect(spec) as host:
        host.mkdir(str(Path(remote_cfg).parent))
        host.write_text(remote_cfg, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    cmd = phases.command(spec.eyas_python, phase, config=remote_cfg, workdir=workdir,
                         datasets=datasets)
    prefix = phase + (f"-{datasets[0]}"[:40] if datasets and len(datasets) == 1 else "")
    with host_slot(spec):
        _, lines = run_remote_job(spec, cmd, prefix=prefix, logger=logger, uses=[workdir])
    result = last_json_line(lines) or {}
    parts = [result] if phase == "merge" else list(result.values())
    if parts and all(isinstance(r, dict) and r.get("skipped") for r in parts):
        return skipped(result, f"{phase} on {spec.login}: output already complete")
    return result

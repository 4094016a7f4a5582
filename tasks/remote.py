"""Prefect tasks that act on a host (this machine or a GPU host over SSH).

Tasks receive a `HostSpec` (plain data) and open their own connection; a Fabric
Connection never crosses a task boundary. Every remote task holds a slot of the host's
concurrency limit (`tasks.limits`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from eyas.config import load_config
from eyas.disk import human_bytes
from eyas.errors import RemoteError
from eyas.prepare import phases
from eyas.remote.clean import execute_clean, plan_clean, wait_for_running_deletions
from eyas.remote.hosts import HostSpec, connect
from eyas.remote.probe import hidden_size_from_config, shard_expectation, status
from tasks.jobs import last_json_line, run_remote_job
from tasks.limits import host_slot


@task(name="probe-status", retries=2, retry_delay_seconds=[5, 30])
def status_task(spec: HostSpec, workdir: str, config_path: str) -> dict:
    """What is complete, partial or missing in `workdir` on the host, what comes next, and
    whether it fits on the host's disk (sized by the config's extraction storage)."""
    cfg = load_config(config_path)
    with host_slot(spec), connect(spec) as host:
        report = status(host, workdir, expected=[d.name for d in cfg.datasets],
                        generated=[d.name for d in cfg.datasets if d.regenerate],
                        shards=shard_expectation(cfg),
                        hidden_size=hidden_size_from_config(cfg), storage=cfg.extract.storage,
                        topk=cfg.extract.topk, dtype=cfg.extract.dtype)
    get_run_logger().info("status on %s:\n%s", spec.login, report.text())
    create_table_artifact(report.rows(), key="host-status", description=f"Outputs in {spec.login}:{workdir}")
    return report.to_dict()


@task(name="clean", retries=0)
def clean_task(spec: HostSpec, paths: list[str], in_use: list[str], confirm: bool) -> dict:
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
        key="host-clean", description="Deletion of obsolete outputs",
    )
    if report.refused:
        raise RemoteError(
            "refused to delete: " + "; ".join(f"{p} ({why})" for p, why in report.refused)
        )
    return {"dry_run": report.dry_run, "deleted": report.deleted, "bytes_freed": report.bytes_freed,
            "freed": human_bytes(report.bytes_freed)}


@task(name="prepare-on-host", task_run_name="{phase}-on-host", retries=1, retry_delay_seconds=30)
def prepare_on_host_task(spec: HostSpec, phase: str, config_path: str, workdir: str) -> dict[str, Any]:
    """Run a data-preparation phase (``python -m eyas.prepare <phase>``, with the host's eyas
    interpreter) on the host as a detached job.

    The config is copied next to the run on the host; the job's log streams into this task's
    log; a dropped connection does not stop the job (`attach` reconnects), and cancelling or
    interrupting the task cancels it. Returns the phase's JSON result.
    """
    logger = get_run_logger()
    with connect(spec) as host:
        remote_cfg = f"{workdir.rstrip('/')}/.eyas/config-{phase}.yaml"
        host.mkdir(str(Path(remote_cfg).parent))
        host.put_file(config_path, remote_cfg)
    cmd = phases.command(spec.eyas_python, phase, config=remote_cfg, workdir=workdir)
    with host_slot(spec):
        _, lines = run_remote_job(spec, cmd, prefix=phase, logger=logger, uses=[workdir])
    return last_json_line(lines) or {}

"""The `preflight` flow: minutes on the GPU host that prove every GPU piece of the run.

    preflight task (here, or a detached job on the host: environment, disk, collectives,
    capture, training, serving, each under its own time limit) -> go/no-go table artifact

The same stage opens ``eyas-pipeline`` whenever a GPU host is given (`preflight_stage`). A GO
for the same host, recipe and code comes back Cached; a NO-GO fails the flow run naming each
failed check and its fix.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from blocks.gpu_host import GpuHost
from eyas import stopping
from eyas.config import PipelineConfig
from eyas.preflight.result import no_go
from eyas.remote.hosts import HostSpec
from tasks.hosts import resolve_run, run_lock
from tasks.jobs import cancel_remote_jobs
from tasks.preflight import preflight_task


@flow(name="preflight", log_prints=True, on_cancellation=[cancel_remote_jobs])
def preflight_flow(config: PipelineConfig, workdir: str,
                   host_block: GpuHost | None = None) -> dict[str, Any]:
    """Run the preflight checks of a pipeline config for the run at `workdir`.

    Args:
        config: the pipeline configuration (its ``preflight`` section: samples, training
            steps, time limits; the rest as the run will use it).
        workdir: the run's folder, with merged data (``eyas prepare``); on the host when
            `host_block` is given. Preflight works in ``<workdir>/preflight`` only.
        host_block: a saved ``GpuHost`` block: the checks run there as a detached job.

    Returns the report ``{"ok", "checks": [...], "eta": {"extract_s", "train_s"}}``; raises
    `eyas.preflight.result.PreflightFailed` (after publishing the table) on NO-GO.
    """
    stopping.watch()  # a deployment's run: a cancel's SIGTERM reaches the tasks
    workdir, host = resolve_run(workdir, host_block, config.gpu_env)
    with run_lock(workdir, host, "preflight"):
        return preflight_stage(config, workdir, host)


def preflight_stage(cfg: PipelineConfig, workdir: str, host: HostSpec | None,
                    wait_for: list[Any] | None = None) -> dict[str, Any]:
    """Preflight inside the running flow; PreflightFailed (with the report) on NO-GO."""
    rep = preflight_task.submit(cfg, workdir, host, wait_for=wait_for or []).result()
    if not rep["ok"]:
        raise no_go(rep)
    return rep

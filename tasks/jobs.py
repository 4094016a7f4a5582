"""Remote jobs from Prefect tasks: started (or re-attached) detached, streamed, cancellable.

A job's id carries the flow run that started it (``<prefix>-<time>-fr<flow run>-<hex>``):
- a restarted flow re-attaches to a job of the same `prefix` that is still running, instead
  of starting the same work twice;
- `cancel_remote_jobs`, a flow's ``on_cancellation`` hook, stops every job the cancelled flow
  run started on its host (the flow's process may already be gone: the hook runs in the
  Prefect runner, and finds the jobs by that id).
"""

from __future__ import annotations

from typing import Any

from eyas.remote.hosts import HostSpec, connect
from eyas.remote.jobs import cancel, new_job_id, run_job, running_jobs
from tasks.hosts import host_spec


def _flow_run_tag(flow_run_id: Any) -> str:
    return "fr" + str(flow_run_id).replace("-", "")[:12]


def flow_job_id(prefix: str) -> str:
    """A new job id that names the current flow run (when there is one)."""
    from prefect.runtime import flow_run

    return new_job_id(prefix, _flow_run_tag(flow_run.id) if flow_run.id else "local")


def run_remote_job(spec: HostSpec, cmd: str, *, prefix: str, logger: Any, **kw: Any
                   ) -> tuple[str, list[str]]:
    """`eyas.remote.jobs.run_job` from a task: the job named after the current flow run (so that
    `cancel_remote_jobs` finds it), its lines in the task's `logger`."""
    return run_job(spec, cmd, prefix=prefix, job_id=flow_job_id(prefix),
                   say=lambda line: logger.info("%s", line), **kw)


def cancel_remote_jobs(flow: Any, flow_run: Any, state: Any) -> None:
    """``on_cancellation`` hook: stop the jobs this flow run started on its hosts
    (``host_block`` and ``host_blocks``), or in ``<workdir>/.eyas/jobs`` on this machine (the
    extraction's engine jobs; other local work runs in the flow's own process, which Prefect
    stops itself)."""
    params = flow_run.parameters or {}
    blocks = [b for b in [params.get("host_block"), *(params.get("host_blocks") or [])] if b]
    specs = [host_spec(b, params.get("data_root")) for b in blocks]
    if not specs and params.get("workdir"):
        from pathlib import Path

        from eyas.remote.jobs import jobs_root

        workdir = str(Path(params["workdir"]).resolve())
        if Path(jobs_root(workdir)).is_dir():
            specs = [HostSpec.local(data_root=workdir)]
    tag = f"-{_flow_run_tag(flow_run.id)}-"
    for spec in specs:
        with connect(spec) as host:
            for job_id in running_jobs(host):
                if tag in job_id:
                    cancel(host, job_id)

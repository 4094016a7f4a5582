"""Remote jobs from Prefect tasks: started (or re-attached) detached, streamed, cancellable.

A job's id carries the flow run that started it (``<prefix>-<time>-fr<flow run>-<hex>``):
- a restarted flow re-attaches to a job of the same `prefix` that is still running, instead
  of starting the same work twice;
- `cancel_remote_jobs`, a flow's ``on_cancellation`` hook, stops every job the cancelled flow
  run started on its host (the flow's process may already be gone: the hook runs in the
  Prefect runner, and finds the jobs by that id).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eyas.errors import USER_ERROR_EXIT, ConfigError, RemoteError
from eyas.remote.hosts import HostSpec, connect
from eyas.remote.jobs import attach, cancel, new_job_id, running_jobs, start_or_reattach
from tasks.hosts import host_spec


def _flow_run_tag(flow_run_id: Any) -> str:
    return "fr" + str(flow_run_id).replace("-", "")[:12]


def flow_job_id(prefix: str) -> str:
    """A new job id that names the current flow run (when there is one)."""
    from prefect.runtime import flow_run

    return new_job_id(prefix, _flow_run_tag(flow_run.id) if flow_run.id else "local")


def run_remote_job(
    spec: HostSpec,
    cmd: str,
    *,
    prefix: str,
    logger: Any,
    env: Mapping[str, str] | None = None,
    uses: list[str] | None = None,
    poll_interval: float = 1.0,
    on_line: Callable[[str], str | None] | None = None,
    cancel_grace: float | None = None,
    refusal_where: str | None = None,
) -> tuple[str, list[str]]:
    """Run `cmd` on the host as a detached job (or re-attach to the running one for `prefix`),
    stream its log lines to `logger`, and return ``(job_id, lines)``.

    `on_line` sees each line first; what it returns, when not None, is logged instead of the
    line (a JSON record made readable, say). Stopped (a cancelled flow, Ctrl-C, SIGTERM:
    `eyas.stopping`), it cancels the job: TERM, KILL after `cancel_grace` seconds (default
    `eyas.remote.hosts.KILL_GRACE_S`; training gives its step and checkpoint longer). Raises
    RemoteError naming the host, job and exit code, with the log's tail, when it fails; with
    `refusal_where` (the config section), ConfigError with the job's error lines when it exits
    with `USER_ERROR_EXIT` (its configuration or data refused: a retry cannot help).
    """
    lines: list[str] = []

    def sink(line: str) -> None:
        lines.append(line)
        shown = on_line(line) if on_line is not None else None
        logger.info("[%s] %s", spec.login, line if shown is None else shown)

    with connect(spec) as host:
        job_id, reattached = start_or_reattach(
            host, cmd, prefix=prefix, job_id=flow_job_id(prefix), env=env, uses=uses
        )
        logger.info("%s job %s on %s", "re-attached to" if reattached else "started", job_id, spec.login)
        code = attach(host, job_id, stream=sink, poll_interval=poll_interval,
                      **({} if cancel_grace is None else {"cancel_grace": cancel_grace}))
    if code == USER_ERROR_EXIT and refusal_where is not None:
        errors = [x for x in lines if x.startswith("error")] or lines[-20:]
        raise ConfigError(f"{spec.login}: job {job_id} refused its configuration or data:\n"
                          + "\n".join(errors[-20:]), where=refusal_where)
    if code != 0:
        tail = "\n".join(lines[-20:])
        raise RemoteError(f"{spec.login}: job {job_id} exited with {code}; log tail:\n{tail}")
    return job_id, lines


def last_json_line(lines: list[str]) -> dict | None:
    """The last line that is a JSON object (our entry points print their summary last)."""
    import json

    for line in reversed(lines):
        if line.startswith("{"):
            return json.loads(line)
    return None


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

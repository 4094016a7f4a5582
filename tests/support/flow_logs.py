"""The log lines a flow run streamed from a host job, read back from the Prefect test server."""

from __future__ import annotations

import time
from collections.abc import Callable


def streamed_lines(client, flow_run_id, login: str,
                   until: Callable[[list[str]], bool], seconds: float = 10.0) -> list[str]:
    """The flow run's log messages that came from `login`'s job (``[login] ...``), read until
    `until(lines)` holds or `seconds` pass (logs reach the server in batches)."""
    return run_messages(client, flow_run_id, until, seconds,
                        keep=lambda m: m.startswith(f"[{login}]"))


def run_messages(client, flow_run_id, until: Callable[[list[str]], bool], seconds: float = 10.0,
                 keep: Callable[[str], bool] = lambda m: True) -> list[str]:
    """The flow run's log messages that `keep` selects, in order, read until `until(lines)`
    holds or `seconds` pass."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    deadline = time.monotonic() + seconds
    while True:
        logs = client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), sort=LogSort.TIMESTAMP_ASC)
        lines = [x.message for x in logs if keep(x.message)]
        if until(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)

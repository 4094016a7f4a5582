"""The task runs of a flow run and their final states, read back from the Prefect test server."""

from __future__ import annotations

import time


def task_runs(client, run, wait: float = 30.0) -> list:
    """The task runs of a flow run (its final `State`, or its id), once each has a final state.

    Prefect 3 records task run states from events, after the flow's own state: right after a
    flow returns, a task run may still show no state, or a passing one (Running,
    AwaitingRetry). This reads again until every task run has a final state, for at most
    `wait` seconds, then returns what it read (an assertion on a state still not final then
    fails showing it)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = getattr(getattr(run, "state_details", None), "flow_run_id", None) or run
    deadline = time.monotonic() + wait
    while True:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[flow_run_id])))
        if all(tr.state is not None and tr.state.is_final() for tr in runs):
            return runs
        if time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def task_states(client, run, wait: float = 30.0) -> dict[str, str]:
    """Task run name -> final state name (Completed, Cached, Skipped, Failed...) of a flow run
    (its final `State`, or its id); the latest task run of each name wins. A task run whose
    state is still not recorded after `wait` seconds shows as "no state yet"."""
    runs = task_runs(client, run, wait)
    return {tr.name: tr.state.name if tr.state is not None else "no state yet"
            for tr in sorted(runs, key=lambda t: t.expected_start_time)}

"""The final state of each task of a flow run, read back from the Prefect test server."""

from __future__ import annotations

import time


def task_states(client, run, wait: float = 30.0) -> dict[str, str]:
    """Task run name -> final state name (Completed, Cached, Skipped, Failed...) of a flow
    run (its final `State`, or its id); the latest task run of each name wins.

    Prefect 3 records task run states from events, after the flow's own state: right after a
    flow returns, a task run may still show no state, or a passing one (Running,
    AwaitingRetry). This reads again until every task run has a final state, for at most
    `wait` seconds; what is still not final then is named as such ("no state yet" or its
    state), so an assertion on it fails saying why."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = getattr(getattr(run, "state_details", None), "flow_run_id", None) or run
    deadline = time.monotonic() + wait
    while True:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[flow_run_id])))
        settled = all(tr.state is not None and tr.state.is_final() for tr in runs)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {tr.name: tr.state.name if tr.state is not None else "no state yet"
            for tr in sorted(runs, key=lambda t: t.expected_start_time)}

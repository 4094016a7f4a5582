"""The final state of each task of a flow run, read back from the Prefect test server."""

from __future__ import annotations


def task_states(client, state) -> dict[str, str]:
    """Task run name -> final state name (Completed, Cached, Skipped, Failed...) of the flow
    run behind `state`; the latest task run of each name wins."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
        id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    return {tr.name: tr.state.name for tr in sorted(runs, key=lambda t: t.expected_start_time)}

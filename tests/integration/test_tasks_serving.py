"""tasks.serving: the serving benchmark as a Prefect task inside a flow (this machine as the
host, the SGLang stand-in as the server): rows returned and written, a table artifact with the
verdict, job ids that name the flow run (what its cancellation hook looks for)."""

from __future__ import annotations

import json
import sys

import pytest
from support.serving_fixtures import leftovers, make_run, standin_config

from eyas.proc import free_port
from eyas.remote.hosts import HostSpec, LocalHost
from eyas.remote.jobs import list_jobs

pytestmark = pytest.mark.slow


def test_serving_task_in_a_flow_leaves_rows_a_table_artifact_and_tagged_jobs(
        tmp_path, prefect_client):
    from prefect import flow
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    from tasks.serving import serving_benchmark_task

    run = make_run(tmp_path)
    spec = HostSpec(kind="local", known_hosts=None, data_root=str(tmp_path / "data"),
                    python=sys.executable)
    cfg = standin_config(run, free_port(), batch_sizes=[1], num_prompts=2, num_steps=[3])
    out = tmp_path / "reports" / "serving.json"

    @flow(name="serving-task-test")
    def bench() -> dict:
        return serving_benchmark_task(spec, cfg, str(run["model"]), str(run["drafter"]),
                                      str(run["prompts"]), out_path=str(out))

    state = bench(return_state=True)
    assert state.is_completed(), state.message
    data = state.result()
    assert [r["mode"] for r in data["rows"]] == ["baseline", "eagle3"]
    written = json.loads(out.read_text())
    assert written["verdict"] == data["verdict"] and written["code_version"].startswith("0.")
    assert written["finished_at"].endswith("+00:00") and written["host"].startswith("local:")

    # This flow run's own artifact: other tests publish the same key with other verdicts.
    (art,) = prefect_client.read_artifacts(
        artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["serving-benchmark"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])),
        limit=1)
    assert art.type == "table" and art.description == data["verdict"]
    table = art.data if isinstance(art.data, list) else json.loads(art.data)
    assert [r["mode"] for r in table] == ["baseline", "eagle3"]

    tag = "-fr" + str(state.state_details.flow_run_id).replace("-", "")[:12] + "-"
    jobs = list_jobs(LocalHost(spec))
    assert len(jobs) == 4 and all(tag in j.job_id for j in jobs)
    assert all(j.state != "running" for j in jobs) and leftovers(str(tmp_path)) == []

"""Remote jobs as the flows use them: re-attached after a restart, stopped on cancellation."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from eyas.remote.hosts import HostSpec, LocalHost
from eyas.remote.jobs import cancel, job_status, running_jobs, start_job, start_or_reattach

from .helpers import wait_file


def _host(tmp_path) -> LocalHost:
    return LocalHost(HostSpec(kind="local", data_root=str(tmp_path / "data"), known_hosts=None))


def _waiting_job(host, job_id, flag):
    """A job that runs until `flag` exists: it is running for as long as the test wants."""
    cmd = f"echo started; while [ ! -e {flag} ]; do sleep 0.1; done; echo done"
    return start_job(host, cmd, job_id=job_id)


def test_a_restarted_task_reattaches_to_the_running_job(tmp_path):
    host = _host(tmp_path)
    flag = tmp_path / "go"
    first = _waiting_job(host, "extract-train-00003-20261129T000000-frabc-01", flag)
    other = _waiting_job(host, "extract-train-00004-20261129T000000-frabc-02", flag)
    try:
        job_id, reattached = start_or_reattach(host, "echo never", prefix="extract-train-00003")
        assert (job_id, reattached) == (first.job_id, True)
        assert running_jobs(host, "extract-train-") == [first.job_id, other.job_id]
    finally:
        flag.write_text("1")
    wait_file(tmp_path / "data" / ".eyas" / "jobs" / first.job_id / "exit_code")
    # Nothing running any more: the same call starts new work.
    job_id, reattached = start_or_reattach(host, "echo fresh", prefix="extract-train-00003")
    assert not reattached and job_id != first.job_id


@pytest.fixture
def local_block(tmp_path, prefect_harness):
    from blocks.gpu_host import GpuHost

    name = f"local-{uuid.uuid4().hex[:8]}"
    GpuHost(kind="local", data_root=str(tmp_path / "data")).save(name)
    return name


def test_cancelling_a_flow_run_stops_the_jobs_it_started_and_only_those(tmp_path, local_block):
    from tasks.jobs import _flow_run_tag, cancel_remote_jobs

    host = _host(tmp_path)
    run_id, other_run = uuid.uuid4(), uuid.uuid4()
    flag = tmp_path / "never"
    mine = _waiting_job(host, f"extract-train-00001-20261129T000000-{_flow_run_tag(run_id)}-aa", flag)
    theirs = _waiting_job(host, f"extract-train-00002-20261129T000000-{_flow_run_tag(other_run)}-bb", flag)
    try:
        flow_run = SimpleNamespace(id=run_id, parameters={"host_block": local_block, "workdir": "x"})
        cancel_remote_jobs(None, flow_run, None)
        assert job_status(host, mine.job_id).state in {"cancelled", "exited"}
        assert (tmp_path / "data" / ".eyas" / "jobs" / mine.job_id / "cancelled").exists()
        assert job_status(host, theirs.job_id).state == "running"
    finally:
        cancel(host, theirs.job_id)


def test_hook_leaves_jobs_alone_for_a_flow_run_without_a_host(tmp_path):
    """A flow run on this machine (no host block) runs its work in its own process, which
    Prefect stops: the hook must not touch jobs, even ones that carry the run's tag."""
    from tasks.jobs import _flow_run_tag, cancel_remote_jobs

    host = _host(tmp_path)
    run_id = uuid.uuid4()
    job = _waiting_job(host, f"extract-train-00001-20261129T000000-{_flow_run_tag(run_id)}-cc",
                       tmp_path / "never")
    try:
        cancel_remote_jobs(None, SimpleNamespace(id=run_id, parameters={"host_block": None}), None)
        assert job_status(host, job.job_id).state == "running"
    finally:
        cancel(host, job.job_id)

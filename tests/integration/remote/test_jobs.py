"""Detached jobs: local host without SSH, and over the suite's sshd (surviving a killed session)."""

from __future__ import annotations

import shlex
import sys

import pytest

from eyas.errors import ConfigError, RemoteError
from eyas.remote.hosts import HostSpec, LocalHost, RemoteTimeoutError, SSHHost
from eyas.remote.jobs import (
    attach,
    build_run_script,
    cancel,
    job_dir,
    job_status,
    list_jobs,
    read_log,
    start_job,
)

from .helpers import alive, kill_sshd_session, wait_dead, wait_file, wait_for


def _local(tmp_path) -> LocalHost:
    return LocalHost(HostSpec(kind="local", data_root=str(tmp_path / "data"), known_hosts=None))


def test_run_script_and_job_ids():
    script = build_run_script("echo $A", cwd="/d x", env={"A": "1 2"})
    assert script == ("#!/bin/sh\ntrap 'exit $?' TERM\ncd '/d x' || exit 97\n"
                      "export A='1 2'\necho $A\n")
    with pytest.raises(ConfigError):
        job_dir("/data", "../escape")


def test_local_job_runs_and_is_collected(tmp_path):
    host = _local(tmp_path)
    h = start_job(host, "echo first; sleep 0.3; echo second; exit 7", job_id="j1",
                  env={"GREETING": "hi"}, cwd=str(tmp_path), uses=[str(tmp_path / "in")])
    lines: list[str] = []
    assert attach(host, "j1", stream=lines.append, poll_interval=0.1) == 7
    assert lines == ["first", "second"]
    st = job_status(host, "j1")
    assert (st.state, st.exit_code, st.cwd, st.uses) == ("exited", 7, str(tmp_path),
                                                          (str(tmp_path / "in"),))
    assert h.dir.endswith("/.eyas/jobs/j1")
    with pytest.raises(RemoteError, match="already taken"):
        start_job(host, "true", job_id="j1")
    assert [j.job_id for j in list_jobs(host)] == ["j1"]


def test_local_job_attach_from_offset_and_partial_line(tmp_path):
    host = _local(tmp_path)
    go = tmp_path / "go"
    # The job holds after its first lines until the test says go: it is running while read.
    start_job(host, f"printf 'a\\nb\\n'; while [ ! -e {go} ]; do sleep 0.05; done; "
                    "printf 'c\\nno-newline'", job_id="j2")
    log = tmp_path / "data" / ".eyas" / "jobs" / "j2" / "log"
    wait_for(lambda: log.exists() and log.read_text() == "a\nb\n", what="the first lines")
    st, text, off = read_log(host, "j2")
    assert st.state == "running" and text == "a\nb\n" and off == 4
    go.write_text("go")
    lines: list[str] = []
    assert attach(host, "j2", stream=lines.append, poll_interval=0.1, offset=off) == 0
    assert lines == ["c", "no-newline"]


def test_local_cancel_kills_the_group(tmp_path):
    host = _local(tmp_path)
    pidfile = tmp_path / "child.pid"
    start_job(host, f"sleep 60 & echo $! > {pidfile}; wait", job_id="j3")
    child = int(wait_file(pidfile))
    assert job_status(host, "j3").state == "running"
    st = cancel(host, "j3", grace=2)
    assert st.state in {"exited", "cancelled"} and st.state != "running"
    assert wait_dead(child)
    assert cancel(host, "j3").state == st.state  # idempotent


def test_local_cancel_escalates_to_kill(tmp_path):
    host = _local(tmp_path)
    pidfile = tmp_path / "child.pid"
    # The child ignores TERM: only KILL ends it.
    start_job(host, f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done'",
              job_id="j4")
    child = int(wait_file(pidfile))
    cancel(host, "j4", grace=0.5)
    assert wait_dead(child)
    assert job_status(host, "j4").state in {"cancelled", "exited"}


def test_local_attach_timeout_cancels(tmp_path):
    host = _local(tmp_path)
    pidfile = tmp_path / "child.pid"
    start_job(host, f"sleep 60 & echo $! > {pidfile}; wait", job_id="j5")
    child = int(wait_file(pidfile))
    with pytest.raises(RemoteTimeoutError, match="cancelled"):
        attach(host, "j5", poll_interval=0.1, timeout=0.5)
    assert wait_dead(child)


def test_local_lost_job(tmp_path):
    host = _local(tmp_path)
    h = start_job(host, "sleep 60", job_id="j6")
    host.run(f"kill -KILL -{h.pid}")
    wait_for(lambda: job_status(host, "j6").state != "running", what="the job ending")
    assert job_status(host, "j6").state == "lost"
    with pytest.raises(RemoteError, match="without an exit code"):
        attach(host, "j6", poll_interval=0.05)
    assert job_status(host, "nope").state == "unknown"


@pytest.mark.ssh
def test_ssh_job_survives_killed_connection(sshd, tmp_path):
    """Start a job, kill the sshd process serving that session, reconnect, attach, collect."""
    go = tmp_path / "go"
    spec = sshd.spec()
    host = SSHHost(spec)
    # The job waits for a file the test writes only after the session is killed: its ticks
    # prove it kept running with no connection at all.
    h = start_job(host, f"echo begin; while [ ! -e {go} ]; do sleep 0.05; done; "
                        "for i in 1 2 3; do echo tick $i; done; exit 3", job_id="survivor")
    conn = host.connection()
    client_port = conn.transport.sock.getsockname()[1]
    assert kill_sshd_session(sshd.pid, client_port) >= 1
    wait_for(lambda: not conn.is_connected, what="the transport noticing the reset")
    host.close()
    assert alive(h.pid)
    go.write_text("go")

    fresh = SSHHost(spec)
    try:
        lines: list[str] = []
        assert attach(fresh, "survivor", stream=lines.append, poll_interval=0.2) == 3
        assert lines == ["begin", "tick 1", "tick 2", "tick 3"]
    finally:
        go.write_text("go")
        cancel(fresh, "survivor", grace=1)  # no-op when it exited; no stray job on failure
        fresh.close()


@pytest.mark.ssh
@pytest.mark.parametrize("how", ["cancel", "attach-timeout"])
def test_ssh_stopping_a_job_kills_its_remote_process(sshd, tmp_path, how):
    pidfile = tmp_path / "child.pid"
    job_id = f"to-stop-by-{how}"
    with SSHHost(sshd.spec()) as host:
        start_job(host, f"sleep 60 & echo $! > {pidfile}; wait", job_id=job_id)
        child = int(wait_file(pidfile))
        assert job_status(host, job_id).state == "running"
        if how == "cancel":
            cancel(host, job_id, grace=2)
        else:
            with pytest.raises(RemoteTimeoutError):
                attach(host, job_id, poll_interval=0.2, timeout=0.5)
        assert wait_dead(child)
        assert job_status(host, job_id).state != "running"


# ---------------------------------------------------------------- stopping (issue 18)


def test_a_stop_requested_from_another_thread_cancels_the_job_it_follows(tmp_path):
    """`attach` in a worker thread (a Prefect task's) sees the process's stop request at its
    next poll: the job is cancelled and StopRequested raised there."""
    import signal
    import threading

    from eyas import stopping

    host = _local(tmp_path)
    start_job(host, "echo started; sleep 60", job_id="j-stop")
    seen: list[BaseException] = []

    def follow() -> None:
        try:
            attach(host, "j-stop", poll_interval=0.2)
        except BaseException as exc:
            seen.append(exc)

    t = threading.Thread(target=follow, daemon=True)
    try:
        t.start()
        wait_for(lambda: job_status(host, "j-stop").log_bytes > 0, what="the job's first line")
        stopping.request(signal.SIGTERM)
        t.join(20)
        assert not t.is_alive(), "attach went on following after the stop request"
    finally:
        stopping.reset()
    assert len(seen) == 1 and isinstance(seen[0], stopping.StopRequested), seen
    st = job_status(host, "j-stop")
    assert st.state == "exited" and st.exit_code == 143


class _CancelFails(LocalHost):
    """This machine, where cancelling a job fails on "the network"."""

    def run(self, cmd, **kw):
        if "/cancelled;" in cmd:
            raise RemoteError("local: the network went away")
        return super().run(cmd, **kw)


def test_an_interrupt_goes_on_up_when_cancelling_the_job_fails(tmp_path, caplog):
    """Ctrl-C while following: a failure to cancel is logged, never raised in the interrupt's
    place (a caller catching RemoteError would carry on as if nothing was pressed)."""
    host = _CancelFails(HostSpec(kind="local", data_root=str(tmp_path / "data"), known_hosts=None))
    start_job(host, "echo line; sleep 60", job_id="j-int")

    def press_ctrl_c(line: str) -> None:
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            attach(host, "j-int", stream=press_ctrl_c, poll_interval=0.1)
        assert "could not cancel job j-int" in caplog.text
        assert job_status(host, "j-int").state == "running"
    finally:
        cancel(_local(tmp_path), "j-int", grace=1)


def test_a_cancelled_job_records_its_commands_own_exit_code_once_it_has_ended(tmp_path):
    """The job's shell outwaits the TERM: a command that saves its state on TERM (training
    writing its checkpoint) is waited for, and its own exit code is the job's."""
    host = _local(tmp_path)
    saver = ("import signal, sys, time\n"
             "def stop(*_):\n"
             "    time.sleep(1)\n"
             "    print('saved', flush=True)\n"
             "    sys.exit(7)\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
    start_job(host, f"{sys.executable} -c {shlex.quote(saver)}; echo after", job_id="j-save")
    wait_for(lambda: job_status(host, "j-save").log_bytes > 0, what="the job's first line")
    st = cancel(host, "j-save", grace=20)
    assert (st.state, st.exit_code) == ("exited", 7)
    log_text = host.read_text(f"{tmp_path}/data/.eyas/jobs/j-save/log")
    assert log_text.split() == ["ready", "saved"]  # nothing after the command ran

"""Hosts: LocalHost without SSH, SSHHost against the suite's sshd on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from eyas.errors import RemoteError
from eyas.remote.hosts import (
    HostKeyError,
    HostSpec,
    LocalHost,
    RemoteTimeoutError,
    SSHHost,
    build_command,
    connect,
    fingerprint,
    guarded_command,
)

from .helpers import alive, wait_dead, wait_file

# ---------------------------------------------------------------- no SSH


def test_build_command_quotes_cwd_and_env():
    cmd = build_command("echo $A", env={"B": "x y", "A": "it's"}, cwd="/tmp/a b")
    assert cmd == "cd '/tmp/a b' && export A='it'\"'\"'s' && export B='x y' && echo $A"
    with pytest.raises(Exception, match="not valid"):
        build_command("true", env={"A-B": "1"})


def test_local_run_streams_lines_and_reports_failure(tmp_path):
    host = LocalHost()
    lines: list[str] = []
    res = host.run("echo one; echo two >&2; printf three", stream=lines.append, cwd=str(tmp_path),
                   env={"X": "1"})
    assert sorted(lines) == ["one", "three", "two"]
    assert res.stdout == "one\nthree" and res.stderr == "two\n"
    with pytest.raises(RemoteError, match="exit code 3"):
        host.run("echo boom >&2; exit 3")
    assert host.run("exit 4", check=False).exit_code == 4


def test_local_timeout_kills_the_process_group(tmp_path):
    pidfile = tmp_path / "pid"
    with pytest.raises(RemoteTimeoutError, match="ran past"):
        LocalHost().run(f"sleep 60 & echo $! > {pidfile}; wait", timeout=1)
    assert wait_dead(int(wait_file(pidfile)))


def test_guarded_command_kills_group_when_stdin_closes(tmp_path):
    """The watchdog SSH relies on, run with a local pipe standing in for the channel."""
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen(
        ["sh", "-c", guarded_command(f"sleep 60 & echo $! > {pidfile}; wait", grace=1)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
    )
    pid = int(wait_file(pidfile))
    assert alive(pid)
    proc.stdin.close()  # the channel closing
    assert wait_dead(pid)
    proc.wait(timeout=10)


def test_guarded_command_timeout_exit_code_124():
    proc = subprocess.Popen(["sh", "-c", guarded_command("sleep 30", timeout=1, grace=1)],
                            stdin=subprocess.PIPE)  # stdin stays open: the channel is alive
    try:
        assert proc.wait(timeout=30) == 124
    finally:
        proc.stdin.close()


def test_local_disk_free_exists_realpath(tmp_path):
    host = LocalHost()
    assert host.disk_free(str(tmp_path / "not" / "yet")) > 0
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "d")
    assert host.exists(str(tmp_path / "l")) and not host.exists(str(tmp_path / "x"))
    assert host.realpath(str(tmp_path / "l" / ".." / "l")) == str((tmp_path / "d").resolve())
    host.write_text(str(tmp_path / "w" / "f.txt"), "a 'quoted'\nline\n")
    assert host.read_text(str(tmp_path / "w" / "f.txt")) == "a 'quoted'\nline\n"


def test_fingerprint_matches_ssh_keygen(tmp_path):
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    line = (tmp_path / "k.pub").read_text()
    want = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True,
                          text=True, check=True).stdout.split()[1]
    assert fingerprint(line) == want


def test_connect_picks_the_host_kind():
    assert isinstance(connect(HostSpec(kind="local")), LocalHost)
    assert isinstance(connect(HostSpec(host="192.0.2.10")), SSHHost)  # not opened


# ---------------------------------------------------------------- SSH


@pytest.mark.ssh
def test_ssh_run_streams_lines(sshd):
    with SSHHost(sshd.spec()) as host:
        lines: list[str] = []
        res = host.run("for i in 1 2 3; do echo line $i; done; echo warn >&2",
                       stream=lines.append, env={"EYAS_T": "x"})
        assert [x for x in lines if x.startswith("line")] == ["line 1", "line 2", "line 3"]
        assert "warn" in lines and res.exit_code == 0
        assert host.run("echo $EYAS_T", env={"EYAS_T": "a b"}).stdout == "a b\n"
        with pytest.raises(RemoteError, match=rf"@127\.0\.0\.1:{sshd.port}.*exit code 5"):
            host.run("exit 5")


@pytest.mark.ssh
def test_call_runs_here_locally_and_the_command_on_an_ssh_host(sshd, tmp_path):
    """`Host.call`: the one place "in this process, or a command there" is decided."""
    marker = tmp_path / "ran"
    cmd = f"touch {marker}; echo noise; echo '{{\"answer\": 42}}'"
    with LocalHost() as here:  # the function, never the command
        assert here.call(lambda: {"answer": 1}, cmd, what="asking") == {"answer": 1}
    assert not marker.exists()
    assert here.uri(tmp_path / "x") == (tmp_path / "x").resolve().as_uri() and here.on == ""
    with SSHHost(sshd.spec()) as host:  # the command: its last line is the answer
        assert host.call(lambda: {"answer": 1}, cmd, what="asking") == {"answer": 42}
        assert marker.exists()
        assert host.call(lambda: 1, "true", what="stamping") is None  # printed nothing
        with pytest.raises(RemoteError, match=rf"@127\.0\.0\.1:{sshd.port}: asking failed "
                                              r"\(exit 3\): went wrong"):
            host.call(lambda: 1, "echo went wrong >&2; exit 3", what="asking")
        assert host.on == f" on {host.spec.login}"
        assert host.uri("/data/run/x") == (f"sftp://{host.spec.user_name}@127.0.0.1:"
                                           f"{sshd.port}/data/run/x")
    # GPUs: the block says so on a host; here, torch counts them.
    assert SSHHost(sshd.spec(num_gpus=3)).gpu_count() == 3
    import torch

    assert LocalHost(HostSpec.local(num_gpus=5)).gpu_count() == (
        torch.cuda.device_count() if torch.cuda.is_available() else 0)
    # What a shard runs on: CUDA_VISIBLE_DEVICES values there, torch devices here.
    assert SSHHost(sshd.spec(num_gpus=3)).devices() == ["0", "1", "2"]
    assert SSHHost(sshd.spec(num_gpus=0)).devices() == [""]
    assert LocalHost(HostSpec.local()).devices() == (
        [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available()
        else ["cpu"])


@pytest.mark.ssh
def test_ssh_timeout_kills_remote_work(sshd, tmp_path):
    pidfile = tmp_path / "pid"
    with SSHHost(sshd.spec()) as host:
        with pytest.raises(RemoteTimeoutError):
            host.run(f"sleep 60 & echo $! > {pidfile}; wait", timeout=1)
        assert wait_dead(int(wait_file(pidfile)))
        assert host.run("echo still usable").ok


@pytest.mark.ssh
def test_ssh_closed_connection_kills_foreground_command(sshd, tmp_path):
    """Cancelling a flow drops its connection: the remote command must not live on."""
    pidfile = tmp_path / "pid"
    host = SSHHost(sshd.spec())
    conn = host.connection()
    errors: list[BaseException] = []

    def runner():
        try:
            conn.run(guarded_command(f"sleep 60 & echo $! > {pidfile}; wait", grace=1),
                     hide=True, in_stream=False, warn=True)
        except BaseException as exc:  # the channel dies under it
            errors.append(exc)

    t = threading.Thread(target=runner, daemon=True)
    t.start()
    pid = int(wait_file(pidfile))
    assert alive(pid)
    conn.close()
    assert wait_dead(pid)
    host.close()


@pytest.mark.ssh
def test_unknown_host_key_refused(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError, match="no known key"):
        SSHHost(sshd.spec(known_hosts=str(empty))).run("true")


@pytest.mark.ssh
def test_changed_host_key_refused(sshd, tmp_path):
    other = (sshd.root / "other_key.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    with pytest.raises(HostKeyError, match="CHANGED"):
        SSHHost(sshd.spec(known_hosts=str(known))).run("true")
    with pytest.raises(HostKeyError, match="CHANGED"):
        SSHHost(sshd.spec(host_key=f"{other[0]} {other[1]}")).run("true")


@pytest.mark.ssh
def test_pinned_host_key_accepted(sshd):
    with SSHHost(sshd.spec(known_hosts=None, host_key=sshd.host_key_line)) as host:
        assert host.run("echo ok").stdout == "ok\n"


@pytest.mark.ssh
def test_wrong_user_key_names_host_port_user(sshd):
    spec = sshd.spec(key_filename=str(sshd.other_key))
    with pytest.raises(RemoteError, match=rf"{spec.user_name}@127\.0\.0\.1:{sshd.port}.*login refused"):
        SSHHost(spec).run("true")


@pytest.mark.ssh
def test_refused_connection_and_timeout_name_the_host(sshd):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = sshd.spec(port=port)
    spec_known = spec.model_copy(update={"host_key": sshd.host_key_line})
    with pytest.raises(RemoteError, match=rf"@127\.0\.0\.1:{port}: cannot connect"):
        SSHHost(spec_known).run("true")
    # A listener that accepts and never speaks SSH: the banner wait times out.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        port = silent.getsockname()[1]
        spec = sshd.spec(port=port, host_key=sshd.host_key_line, connect_timeout=1)
        start = time.monotonic()
        with pytest.raises(RemoteError, match=rf"@127\.0\.0\.1:{port}"):
            SSHHost(spec).run("true")
        assert time.monotonic() - start < 30
    finally:
        silent.close()


@pytest.mark.ssh
def test_ssh_put_get_file_verified(sshd, tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(bytes(range(256)) * 100)
    remote = str(sshd.data_root / "files" / "a.bin")
    with SSHHost(sshd.spec()) as host:
        host.put_file(src, remote)
        assert host.sha256(remote) == __import__("eyas.io").io.sha256_file(src)
        host.get_file(remote, tmp_path / "back" / "a.bin")
    assert (tmp_path / "back" / "a.bin").read_bytes() == src.read_bytes()


@pytest.mark.ssh
def test_one_connection_per_thread(sshd):
    with SSHHost(sshd.spec()) as host:
        seen = []

        def work():
            seen.append(id(host.connection()))
            host.run("true")

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 3


# ---------------------------------------------------------------- stopping (issue 18)


def _run_in_thread(host, cmd: str) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def runner() -> None:
        try:
            host.run(cmd)
        except BaseException as exc:  # what the worker thread saw
            errors.append(exc)

    t = threading.Thread(target=runner, daemon=True)
    t.start()
    return t, errors


@pytest.mark.parametrize("kind", ["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def test_a_stop_requested_elsewhere_stops_a_command_waiting_in_a_worker_thread(
        kind, request, tmp_path):
    """Signals reach the main thread only; a command that a worker thread (a Prefect task's)
    waits for stops on the process's stop request, and its remote process dies."""
    import signal as _signal

    from eyas import stopping

    if kind == "ssh":
        host = SSHHost(request.getfixturevalue("sshd").spec())
    else:
        host = LocalHost(HostSpec.local(data_root=str(tmp_path)))
    pidfile = tmp_path / "pid"
    try:
        t, errors = _run_in_thread(host, f"sleep 60 & echo $! > {pidfile}; wait")
        pid = int(wait_file(pidfile))
        stopping.request(_signal.SIGTERM)
        t.join(15)
        assert not t.is_alive(), "the command went on after the stop request"
        assert len(errors) == 1 and isinstance(errors[0], stopping.StopRequested), errors
        assert errors[0].exit_code == 143 and "stopped 'sleep 60" in str(errors[0])
        assert wait_dead(pid)
    finally:
        stopping.reset()
        host.close()
    assert host.run("echo still usable").ok

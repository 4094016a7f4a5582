"""Detached jobs against network faults between this machine and the host (the test sshd
behind a TCP proxy on 127.0.0.1): connections reset, and connections that go silent without
a word -- the fault that hangs a client waiting without a timeout."""

from __future__ import annotations

import threading

import pytest
from support.tcp_proxy import TcpProxy

from eyas.remote import jobs
from eyas.remote.hosts import SSHHost
from eyas.remote.jobs import attach, cancel, start_job

from .helpers import wait_for

pytestmark = [pytest.mark.ssh]


@pytest.fixture
def proxied(sshd, tmp_path):
    """A host spec reaching the test sshd through a `TcpProxy` (its own known_hosts line)."""
    proxy = TcpProxy(sshd.port)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{proxy.port} {sshd.host_key_line}\n")
    spec = sshd.spec(port=proxy.port, known_hosts=str(known), data_root=str(tmp_path / "data"))
    yield proxy, spec
    proxy.close()


def _follow(host, job_id: str, lines: list[str]) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        try:
            result["code"] = attach(host, job_id, stream=lines.append, poll_interval=0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["reset", "silence"])
def test_a_followed_job_outlives_a_dropped_connection_and_no_line_is_lost(
        proxied, tmp_path, monkeypatch, fault):
    proxy, spec = proxied
    # A silent connection is noticed after the poll timeout plus the SSH backstop (35 s).
    monkeypatch.setattr(jobs, "POLL_TIMEOUT_S", 1.0)
    go = tmp_path / "go"
    host = SSHHost(spec)
    job_id = f"through-{fault}"
    start_job(host, f"echo begin; while [ ! -e {go} ]; do sleep 0.05; done; "
                    "for i in 1 2 3; do echo tick $i; done; exit 3", job_id=job_id)
    lines: list[str] = []
    thread, result = _follow(host, job_id, lines)
    try:
        wait_for(lambda: lines == ["begin"], 30, "the first line")
        before = proxy.connections
        assert (proxy.cut() if fault == "reset" else proxy.blackhole()) >= 1
        go.write_text("go")  # the job goes on and ends while nothing reaches this machine
        thread.join(120)
        assert not thread.is_alive(), f"attach still waits on a dead connection ({fault})"
        assert "error" not in result, result.get("error")
        assert result["code"] == 3 and lines == ["begin", "tick 1", "tick 2", "tick 3"]
        assert proxy.connections > before  # it reconnected
    finally:
        go.write_text("go")
        with SSHHost(spec) as fresh:
            cancel(fresh, job_id, grace=1)
        host.close()

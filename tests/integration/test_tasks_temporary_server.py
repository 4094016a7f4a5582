"""tasks.temporary_server: the temporary Prefect server of a command dies with it, even when
the command is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest
from support.paths import REPO

COMMAND = """
import sys, time
from prefect.server.api.server import SubprocessASGIServer
if sys.argv[1] == "tied":
    from tasks.temporary_server import start_tied
    assert start_tied()
else:
    from prefect.client.orchestration import get_client
    with get_client(sync_client=True) as client:  # Prefect starts it on first use
        client.hello()
server = SubprocessASGIServer()
print(server.server_process.pid, flush=True)
time.sleep(600)
"""


def _run_then_kill(how: str, tmp_path) -> psutil.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / how), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
               PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", COMMAND, how], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        server = psutil.Process(int(proc.stdout.readline()))
    finally:
        proc.send_signal(signal.SIGKILL)  # no exit code runs: not Prefect's atexit stop
        proc.wait()
    return server


@pytest.mark.slow
def test_a_command_killed_with_sigkill_leaves_no_temporary_server(tmp_path):
    server = _run_then_kill("tied", tmp_path)
    _, alive = psutil.wait_procs([server], timeout=30)
    for p in alive:
        p.kill()
    assert not alive, "the temporary server outlived the command"


@pytest.mark.slow
def test_started_the_way_prefect_does_it_the_server_stays(tmp_path):
    """What `start_tied` changes: Prefect's own start leaves the server running."""
    server = _run_then_kill("prefect", tmp_path)
    try:
        _, alive = psutil.wait_procs([server], timeout=5)
        assert alive, "Prefect now ends its temporary server itself: start_tied may go"
    finally:
        if server.is_running():
            server.kill()


def test_nothing_is_started_when_a_server_is_configured(prefect_harness):
    from tasks.temporary_server import start_tied

    assert start_tied() is False

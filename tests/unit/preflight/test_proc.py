"""eyas.preflight.proc.run_bounded: a check's command stops on a stop request of this process."""

from __future__ import annotations

import signal
import sys
import threading
import time

import psutil

from eyas import stopping
from eyas.preflight.proc import run_bounded


def test_a_stop_request_seen_from_a_worker_thread_ends_the_check_and_its_process_group():
    """SIGTERM / Ctrl-C (`eyas.stopping.request`, what their handler and watcher call) while a
    flow's worker thread runs a check: its command and the command's children are stopped
    within a second or two, not at the check's time limit (600 s here)."""
    code = "import subprocess, time; subprocess.Popen(['sleep', '600']); print('up', flush=True); time.sleep(600)"
    outcome: list = []
    pids: list[int] = []

    def check() -> None:
        try:
            run_bounded([sys.executable, "-c", code], timeout_s=600,
                        on_line=lambda line: pids.append(1) if line == "up" else None)
            outcome.append("ended by itself")
        except stopping.StopRequested as exc:
            outcome.append(exc)

    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not pids:
        assert time.monotonic() < deadline, "the check's command did not start"
        time.sleep(0.05)
    # The check's command (this exact command line) and its child, not whatever else an
    # earlier test in this process may still be waiting on.
    command = [p for p in psutil.Process().children(recursive=True) if p.cmdline()[-1:] == [code]]
    assert len(command) == 1, command
    group = command + command[0].children(recursive=True)
    assert len(group) == 2, group  # the command and its child
    try:
        asked = time.monotonic()
        stopping.request(signal.SIGTERM)
        thread.join(30)
        took = time.monotonic() - asked
    finally:
        stopping.reset()
    assert len(outcome) == 1 and isinstance(outcome[0], stopping.StopRequested), outcome
    assert took < 8.0, f"{took:.1f} s"  # SIGTERM, or SIGKILL after the 5 s grace
    gone, alive = psutil.wait_procs(group, timeout=5)
    assert alive == [], alive

"""What the slot tests share (tests/unit/test_slots.py for the core, tests/integration/test_tasks_limits.py for
the tasks' wrapper): a holder in a process of its own, and a wait for a slot stopped as a
signal would stop it."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from eyas import stopping


def start_holder(argv: list[str], **popen) -> subprocess.Popen:
    """Start `argv`, a process that takes its slots and prints ``held``; return it once it has
    (AssertionError with its stderr when it prints anything else)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        raise AssertionError(f"the holder did not take the slot: {line!r} {proc.stderr.read()}")
    return proc


def stop_the_wait(take: Callable[[], AbstractContextManager], waiting: Callable[[], bool],
                  *, start_s: float) -> tuple[list, float]:
    """Wait in a thread for what `take` takes; once `waiting()` says the wait is under way
    (within `start_s`), ask for a stop (SIGTERM, `eyas.stopping.request`). Returns what the
    thread ended with (``["took the slot"]`` or ``[StopRequested]``) and the seconds from the
    stop to its end; asserts that it ended."""
    outcome: list = []

    def wait() -> None:
        try:
            with take():
                outcome.append("took the slot")
        except stopping.StopRequested as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_s
    while not waiting():
        assert time.monotonic() < deadline, "the wait did not start"
        time.sleep(0.05)
    try:
        asked = time.monotonic()
        stopping.request(signal.SIGTERM)
        thread.join(30)
        took = time.monotonic() - asked
    finally:
        stopping.reset()
    assert not thread.is_alive(), "still waiting after the stop"
    return outcome, took

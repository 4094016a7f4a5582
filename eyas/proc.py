"""Process helpers every phase uses: a free port, whether a pid lives, children that die with
their parent (Linux ``PR_SET_PDEATHSIG``), and stopping a process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` making the child receive SIGTERM when the thread that started it ends
    (Linux ``PR_SET_PDEATHSIG``): a run killed with SIGKILL, which runs no cleanup, leaves no
    server behind holding memory (a GPU's, for a real engine). None where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: not after the fork
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above ran
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent ends (Linux
    ``PR_SET_PDEATHSIG``; it survives exec). False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exit_with_parent(parent_pid: int) -> None:
    """Make this process (a pool worker: call it as the pool's initializer, with the parent's
    pid) receive SIGTERM when the thread that started it ends (Linux ``PR_SET_PDEATHSIG``), and
    end now if `parent_pid` is already gone. Pool workers otherwise outlive a parent killed
    with SIGKILL, blocked forever on their task queue. Does nothing where there is no prctl."""
    if die_with_parent(signal.SIGTERM) and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to `proc`'s process group, SIGKILL when it outlives `grace_s` (then 5 s more);
    returns once the group's leader has ended, or at once when the group is gone."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue

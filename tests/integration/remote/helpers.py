"""Small helpers shared by the remote tests (the 'host' is this machine, so /proc is readable)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(condition, seconds: float = 15.0, what: str = "the condition") -> None:
    """Return as soon as `condition()` holds; fail the test when it does not within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s")
        time.sleep(0.05)


def wait_dead(pid: int, seconds: float = 15.0) -> bool:
    try:
        wait_for(lambda: not alive(pid), seconds)
    except AssertionError:
        return False
    return True


def wait_file(path: Path, seconds: float = 15.0) -> str:
    """The stripped text of `path` once it exists and is not empty."""
    wait_for(lambda: path.exists() and bool(path.read_text().strip()), seconds, f"{path} appearing")
    return path.read_text().strip()


def kill_sshd_session(sshd_pid: int, client_port: int) -> int:
    """SIGKILL the sshd processes serving the TCP connection from `client_port`; return how many."""
    killed = 0
    for proc in psutil.Process(sshd_pid).children(recursive=True):
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.raddr and c.raddr.port == client_port for c in conns):
            os.kill(proc.pid, signal.SIGKILL)
            killed += 1
    return killed

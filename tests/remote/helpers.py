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


def wait_dead(pid: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def wait_file(path: Path, seconds: float = 15.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear")


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

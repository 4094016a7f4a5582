"""One run at a time per work directory: an exclusive ``flock`` on ``<workdir>/.eyas-lock``,
held by the process for as long as it runs and released by the kernel when it ends, however
it ends (kill -9 included: no stale lock to clear by hand). The file names its holder (pid,
command, start time) so that a refused run can say who holds it."""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from eyas.errors import EyasError

LOCK_NAME = ".eyas-lock"


class WorkdirBusy(EyasError):
    """Another process holds the work directory's lock."""


@contextlib.contextmanager
def workdir_lock(workdir: Path, command: str) -> Iterator[Path]:
    """Hold the lock of `workdir` (created if missing) while the block runs; yields the lock
    file. Raises WorkdirBusy naming the holder (pid, command, since) when another process
    holds it. Not re-entrant across processes by design; a second lock of the same folder in
    this process is refused too."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkdirBusy(f"{workdir} is in use by another eyas run ({_holder(path)}); wait "
                              f"for it to end, or stop it, then run again") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({
            "pid": os.getpid(), "command": command,
            "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}).encode())
        yield path
    finally:
        os.close(fd)  # releases the lock


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "holder unknown"
    return f"pid {info['pid']}: {info.get('command', '?')}, since {info.get('since', '?')}"

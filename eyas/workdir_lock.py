"""One run at a time per work directory: an exclusive ``flock`` on ``<workdir>/.eyas-lock``,
held by the process for as long as it runs and released by the kernel when it ends, however
it ends (kill -9 included: no stale lock to clear by hand). The file names its holder (pid,
command, start time) so that a refused run can say who holds it.

Re-entrant within one process: the ``eyas`` command takes the lock and then runs its flow in
the same process, and the flow takes it again (every flow does, for a run started from a
deployment); the inner hold only counts, the outer one releases. Another process is always
refused.

A run folder on an SSH host is locked there, in the same file (`host_workdir_lock`): a small
stdlib Python on the host holds the flock for as long as the SSH channel that started it stays
open, so the lock ends with the controlling process however it ends (its connection closes)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from eyas.errors import EyasError

LOCK_NAME = ".eyas-lock"



class WorkdirBusy(EyasError):
    """Another process holds the work directory's lock."""


class ReentrantHolds:
    """This process's holds of some kind of lock, by key: the first `hold` of a key acquires,
    nested ones only count, and the last to end releases (shared by `workdir_lock` and the
    host's lock, `eyas.remote.workdir_lock`). Per process, not per thread."""

    def __init__(self) -> None:
        self._held: dict[Any, list] = {}
        """key -> [what acquiring gave, hold count]"""
        self._guard = threading.Lock()  # held while acquiring: one acquisition at a time

    @contextlib.contextmanager
    def hold(self, key: Any, acquire: Callable[[], Any],
             release: Callable[[Any], None]) -> Iterator[None]:
        with self._guard:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [acquire(), 0]
            entry[1] += 1
        try:
            yield
        finally:
            with self._guard:
                entry = self._held[key]
                entry[1] -= 1
                if entry[1] == 0:
                    del self._held[key]
                    release(entry[0])


_held = ReentrantHolds()
"""This process's held work-directory locks: resolved lock file -> open descriptor."""


@contextlib.contextmanager
def workdir_lock(workdir: Path, command: str) -> Iterator[Path]:
    """Hold the lock of `workdir` (created if missing) while the block runs; yields the lock
    file. Raises WorkdirBusy naming the holder (pid, command, since) when another process
    holds it. Re-entrant in this process (a nested hold of the same folder, under any
    spelling of its path, counts; the outermost one releases); never across processes."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = (workdir / LOCK_NAME).resolve()
    # Closing the descriptor releases the lock.
    with _held.hold(path, lambda: _acquire(path, workdir, command), os.close):
        yield path


def _acquire(path: Path, workdir: Path, command: str) -> int:
    """The open, flocked descriptor of `path`, its holder written in; WorkdirBusy if taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WorkdirBusy(f"{workdir} is in use by another eyas run ({_holder(path)}); wait "
                          f"for it to end, or stop it, then run again") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({
        "pid": os.getpid(), "command": command,
        "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}).encode())
    return fd


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        text = ""
    return _holder_of(text)


def _holder_of(text: str) -> str:
    """The holder a lock file's text names, in words."""
    try:
        info = json.loads(text or "{}")
    except ValueError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    if not info.get("pid"):
        return "holder unknown"
    return f"pid {info['pid']}: {info.get('command', '?')}, since {info.get('since', '?')}"

"""A work directory's lock held on an SSH host: ``<workdir>/.eyas-lock`` there, the file an
``eyas`` command run on the host locks (`eyas.workdir_lock`), taken by the host's stdlib Python
through an SSH channel of its own and freed when that channel ends."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shlex
import socket
from collections.abc import Iterator

from eyas.errors import RemoteError
from eyas.remote.hosts import open_connection
from eyas.workdir_lock import ReentrantHolds, WorkdirBusy, _holder_of

_held_remote = ReentrantHolds()
"""This process's held locks on hosts: (login, workdir) -> its `_HostHolder`."""


HOLD_ON_HOST = """
import fcntl, os, sys
wd, info = sys.argv[1], sys.argv[2]
os.makedirs(wd, exist_ok=True)
path = os.path.join(wd, ".eyas-lock")
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    with open(path, encoding="utf-8", errors="replace") as fh:
        sys.stdout.write("busy " + fh.read().replace("\\n", " ") + "\\n")
    sys.stdout.flush()
    sys.exit(75)
os.ftruncate(fd, 0)
os.write(fd, info.encode())
sys.stdout.write("held\\n")
sys.stdout.flush()
sys.stdin.read()  # until the channel closes: the holder's end, or its connection's
"""
"""The holder on the host (its stdlib Python, `HostSpec.python`): ``busy <lock file>`` and
exit 75 when taken, else ``held``, then the lock until its standard input ends."""
HOST_LOCK_TIMEOUT_S = 60.0
"""Seconds for the host to answer ``held`` or ``busy`` (a connection is opened first)."""


@contextlib.contextmanager
def host_workdir_lock(spec, workdir: str, command: str) -> Iterator[str]:
    """Hold the lock of `workdir` on the SSH host `spec` (`eyas.remote.hosts.HostSpec`) --
    ``<workdir>/.eyas-lock`` there, the file an ``eyas`` command run on the host locks -- while
    the block runs, through an SSH channel of its own; yields ``login:workdir``. Raises
    WorkdirBusy naming the holder when another run holds it, RemoteError when the host cannot
    be reached or its Python fails. Re-entrant in this process, like `workdir_lock`. The
    lock ends when the channel does: at the block's end, when this process dies (its
    connection closes), or when the connection is lost (as soon as sshd notices)."""
    with _held_remote.hold((spec.login, workdir), lambda: _HostHolder(spec, workdir, command),
                           _HostHolder.release):
        yield f"{spec.login}:{workdir}"


class _HostHolder:
    """The holder process on the host and the SSH connection it lives on."""

    def __init__(self, spec, workdir: str, command: str) -> None:
        info = json.dumps({
            "pid": os.getpid(), "command": f"{command} from {socket.gethostname()}",
            "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
        self.conn = open_connection(spec)
        try:
            self.chan = self.conn.client.get_transport().open_session()
            self.chan.settimeout(HOST_LOCK_TIMEOUT_S)
            self.chan.exec_command(" ".join(shlex.quote(w) for w in (
                spec.python, "-c", HOLD_ON_HOST, workdir, info)))
            out = self.chan.makefile("r")
            line = out.readline().rstrip("\n")
        except BaseException as exc:
            self.conn.close()
            if isinstance(exc, Exception):
                raise RemoteError(f"{spec.login}: locking {workdir} failed: {exc}") from exc
            raise
        if line == "held":
            return
        err = self.chan.makefile_stderr("r").read()[-2000:] if not line else ""
        self.conn.close()
        if line.startswith("busy"):
            raise WorkdirBusy(f"{spec.login}:{workdir} is in use by another eyas run "
                              f"({_holder_of(line[4:].strip())}); wait for it to end, or stop "
                              f"it, then run again")
        raise RemoteError(f"{spec.login}: locking {workdir} with {spec.python} failed: "
                          f"{line or err.strip() or 'no answer'}")

    def release(self) -> None:
        """End the holder (its standard input closed) and wait for it, then the connection."""
        with contextlib.suppress(Exception):
            self.chan.shutdown_write()
            self.chan.status_event.wait(HOST_LOCK_TIMEOUT_S)
        with contextlib.suppress(Exception):
            self.conn.close()

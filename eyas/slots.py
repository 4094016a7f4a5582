"""Concurrency slots the kernel frees: a pool is a folder of lock files, a slot is held while a
process holds the ``flock`` of one of them.

    <root>/eyas-gpu-local/slot-0   one file per slot (``slot-0`` .. ``slot-<N-1>``)
    <root>/eyas-gpu-local/slot-1
    <root>/eyas-host-local/slot-0 ...

A process takes a slot by locking a free file (``flock(LOCK_EX | LOCK_NB)``) and holds it as
long as the file stays open. The kernel drops the lock when the last descriptor of that open
file closes: at the holder's release, and however the holder ends -- an exception, SIGTERM,
SIGKILL, the OOM killer. Nothing is recorded elsewhere, so there is nothing to give back after
a crash; a reboot frees every slot. (The descriptor is not inherited by programs the holder
starts: Python opens it close-on-exec.)

While it holds a slot the holder writes who it is into the file (`Holder`: pid, host, since
when, its command line, and a label such as its flow run): a run waiting for a slot names the
holders at once and every `WAIT_LOG_S`, with how long it has waited. The text is only ever
believed while the file is locked: a free slot's file keeps its last holder's words, or none.

A pool's size is the number of its slot files: `ensure_pool` creates the folder with a size
when it is missing and leaves an existing one as it is (an operator resizes it by adding or
removing ``slot-<i>`` files; a removed file still held stays held by its holder until the end,
and no one else can take it). The pools of this machine live under `slots_root`
(``$EYAS_SLOTS_DIR``, else ``$XDG_STATE_HOME/eyas/slots``, else ``~/.local/state/eyas/slots``);
``python -m eyas.slots`` prints every pool and its holders.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from eyas import stopping
from eyas.errors import ConfigError

SLOTS_ENV = "EYAS_SLOTS_DIR"
"""Environment variable naming the folder of this machine's slot pools (`slots_root`)."""
POLL_S = 1.0
"""Seconds between two tries of a run waiting for a slot (a stop ends the wait at once)."""
WAIT_LOG_S = 30.0
"""How often a run waiting for a slot says who holds it."""
COMMAND_CHARS = 300
"""At most this much of a holder's command line is written into its slot."""
SLOT_PREFIX = "slot-"

Say = Callable[[str], None]


def slots_root() -> Path:
    """The folder of this machine's pools, shared by every eyas run here: ``$EYAS_SLOTS_DIR``,
    else ``$XDG_STATE_HOME/eyas/slots``, else ``~/.local/state/eyas/slots``."""
    if os.environ.get(SLOTS_ENV):
        return Path(os.environ[SLOTS_ENV]).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state).expanduser() / "eyas" / "slots"


def pool_dir(name: str, root: Path | None = None) -> Path:
    """The folder of the pool `name` (a plain name: letters, digits, ``.``, ``_``, ``-``)."""
    if not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", name) or name in (".", ".."):
        raise ConfigError(f"a slot pool's name is one folder name of letters, digits, '.', '_' "
                          f"and '-', not {name!r}", where=name)
    return (root or slots_root()) / name


def ensure_pool(name: str, size: int, root: Path | None = None) -> Path:
    """The folder of pool `name`, created with `size` slots when missing (an existing pool
    keeps its slots, whatever `size` says). Two runs creating it at once make one pool: it is
    built under a temporary name and renamed into place."""
    if size < 1:
        raise ConfigError(f"a slot pool has at least 1 slot, not {size}", where=name)
    folder = pool_dir(name, root)
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{name}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    for i in range(size):
        (tmp / f"{SLOT_PREFIX}{i}").touch()
    try:
        tmp.rename(folder)
    except OSError as exc:  # another run created it meanwhile
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        for path in tmp.iterdir():
            path.unlink()
        tmp.rmdir()
    return folder


def pool_slots(folder: Path) -> list[Path]:
    """The slot files of a pool, by index (``slot-0``, ``slot-1``, ... ``slot-10``)."""
    slots = [p for p in folder.iterdir()
             if p.name.startswith(SLOT_PREFIX) and p.name[len(SLOT_PREFIX):].isdigit()]
    return sorted(slots, key=lambda p: int(p.name[len(SLOT_PREFIX):]))


# -- who holds a slot ------------------------------------------------------------------------
@dataclass(frozen=True)
class Holder:
    """What a holder writes into the slot it holds."""

    pid: int
    host: str
    since: str
    """When the slot was taken (ISO 8601, UTC)."""
    command: str | None = None
    """The holder's command line (shortened): which run, which workdir."""
    who: str | None = None
    """What the holder is, for a person (``flow run 'tricky-crab' (task 'train-drafter')``)."""

    @classmethod
    def current(cls, who: str | None = None) -> Holder:
        return cls(pid=os.getpid(), host=socket.gethostname(),
                   since=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   command=command_line(), who=who)

    def held_for_s(self) -> float:
        since = _dt.datetime.fromisoformat(self.since)
        return (_dt.datetime.now(_dt.timezone.utc) - since).total_seconds()

    def text(self) -> str:
        """Who this is: what, host, pid, since when (and how long), its command."""
        since = _dt.datetime.fromisoformat(self.since)
        command = f", running `{self.command}`" if self.command else ""
        return (f"{self.who or 'a process outside any flow run'} on host {self.host}, pid "
                f"{self.pid}, since {since:%Y-%m-%d %H:%M:%S} UTC "
                f"({duration(self.held_for_s())}){command}")


def duration(seconds: float) -> str:
    """``45 s``, ``7 min 12 s``, ``3 h 05 min``."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a person would type it (``eyas train --config ... --workdir
    ...``: the ``python -m eyas.cli`` of the entry point shown as ``eyas``), shortened."""
    args = list(sys.argv if argv is None else argv)
    if args and Path(args[0]).name in ("cli.py", "eyas"):
        args = ["eyas", *args[1:]]
    text = shlex.join(args)
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 3] + "..."


def is_held(slot: Path) -> bool:
    """Whether some process holds `slot` now (its lock cannot be taken). A missing file is
    not held."""
    try:
        fd = os.open(slot, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return False


def read_holder(slot: Path) -> Holder | None:
    """What the slot's file says of its holder; None when it says nothing readable (a holder
    between taking the slot and writing, or a file written by hand)."""
    try:
        return Holder(**json.loads(slot.read_text()))
    except (OSError, ValueError, TypeError):
        return None


SETTLE_S = 0.2
"""How long `holders` waits for a held slot whose file says nothing to settle: a holder writes
its record right after taking the lock, and empties the file right before letting it go."""


def holders(folder: Path) -> list[tuple[Path, Holder | None]]:
    """The held slots of a pool and what each file says of its holder, by index. A held slot
    whose file is empty is read again for up to `SETTLE_S`: it is being taken (the record
    follows) or given back (it is then left out); None only if it stays so."""
    out = []
    for slot in pool_slots(folder):
        if not is_held(slot):
            continue
        holder = read_holder(slot)
        deadline = time.monotonic() + SETTLE_S
        while holder is None and time.monotonic() < deadline:
            time.sleep(0.01)
            if not is_held(slot):
                break
            holder = read_holder(slot)
        else:
            out.append((slot, holder))
    return out


# -- taking slots ----------------------------------------------------------------------------
class Holding:
    """Slots this process holds (open, locked files); `release` gives them back."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.slots: list[Path] = []

    def release(self) -> None:
        for fd in reversed(self.fds):
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # the next reader finds no stale holder in a free slot
            os.close(fd)  # the kernel drops the lock with the last descriptor
        self.fds, self.slots = [], []


def _take_one(folder: Path, record: bytes, holding: Holding) -> bool:
    for slot in pool_slots(folder):
        try:
            fd = os.open(slot, os.O_RDWR)
        except FileNotFoundError:  # removed by an operator meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        holding.fds.append(fd)
        holding.slots.append(slot)
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        return True
    return False


def try_take(wants: dict[Path, int], holder: Holder) -> Holding | None:
    """Take `wants[pool]` slots of every pool at once, writing `holder` into each; None (taking
    nothing) when some pool has fewer free."""
    holding = Holding()
    record = json.dumps(asdict(holder)).encode()
    for folder, n in wants.items():
        for _ in range(n):
            if not _take_one(folder, record, holding):
                holding.release()
                return None
    return holding


def _check(wants: dict[Path, int]) -> None:
    missing = [str(f) for f in wants if not f.is_dir()]
    if missing:
        raise ConfigError(f"the slot pool(s) {missing} do not exist; eyas creates them before use "
                          "(eyas.slots.ensure_pool)", where=", ".join(missing))
    for folder, n in wants.items():
        size = len(pool_slots(folder))
        if n > size:
            raise ConfigError(f"cannot take {n} slot(s) of {folder.name}: it has {size} (add "
                              f"slot files to {folder}, slot-{size} and on)", where=str(folder))


def waiting_text(wants: dict[Path, int], waited_s: float) -> str | None:
    """What a waiting run says: per pool it cannot take from, its use and who holds it; how
    long it has waited. None when every pool has the slots free by now (one was given back
    since the run tried): the run tries again rather than say so."""
    parts = []
    for folder, n in wants.items():
        size, held = len(pool_slots(folder)), holders(folder)
        if size - len(held) >= n:
            continue
        text = f"{folder.name} has {len(held)}/{size} slot(s) in use"
        if held:
            text += ", held by " + "; ".join(
                h.text() if h else f"a process that has not written into {slot.name} yet"
                for slot, h in held)
        parts.append(text)
    names = ", ".join(f.name for f in wants)
    occupy = max(wants.values())
    if not parts:
        return None
    return (f"waiting for {occupy} slot(s) of {names} (waited {duration(waited_s)}): "
            + " | ".join(parts))


def _log(message: str) -> None:
    logging.getLogger("eyas.slots").warning("%s", message)


@contextlib.contextmanager
def hold(wants: dict[Path, int], *, who: str | None = None, say: Say = _log,
         poll_s: float = POLL_S, wait_log_s: float = WAIT_LOG_S) -> Iterator[Holding]:
    """Hold `wants[pool]` slots of every pool (taken all at once) while the block runs.

    Waits as long as it takes, saying at once and every `wait_log_s` who holds the slots and
    how long it has waited, and once it has them, how long it waited. Raises ConfigError when a
    pool is missing or smaller than what is wanted (waiting could never end);
    `eyas.stopping.StopRequested` within `poll_s` of a stop request while it waits (nothing
    taken). The slots are released as the block is left, a stop included, and by the kernel
    when the process dies.
    """
    wants = {Path(f): n for f, n in wants.items() if n > 0}
    if not wants:
        yield Holding()
        return
    _check(wants)
    names = ", ".join(f.name for f in wants)
    start = time.monotonic()
    next_log = start
    while True:
        holding = try_take(wants, Holder.current(who))
        now = time.monotonic()
        if holding is not None:
            break
        if now >= next_log:
            text = waiting_text(wants, now - start)
            if text is not None:  # None: given back since the try; tried again shortly
                say(text)
                next_log = now + wait_log_s
        # A stop (SIGTERM, Ctrl-C, seen from this worker thread) ends the wait at once.
        if stopping.wait(max(0.05, min(poll_s, next_log - now))):
            stopping.check(f"while waiting {duration(time.monotonic() - start)} for "
                           f"{max(wants.values())} slot(s) of {names}")
    if now - start >= 1.0:
        say(f"got {max(wants.values())} slot(s) of {names} after waiting {duration(now - start)}")
    try:
        yield holding
    finally:
        holding.release()


def main(argv: list[str] | None = None) -> int:
    """``python -m eyas.slots [ROOT]``: every pool under ROOT (default `slots_root`), its use
    and who holds it."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else slots_root()
    pools = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
        if root.is_dir() else []
    if not pools:
        print(f"no slot pools under {root}")
    for folder in pools:
        held = holders(folder)
        print(f"{folder.name}: {len(held)}/{len(pool_slots(folder))} slot(s) in use")
        for slot, h in held:
            print(f"  {slot.name}: {h.text() if h else 'held (no holder written yet)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Who holds the slots of a concurrency limit, and giving back the slots of the dead.

Prefect counts a global limit's occupied slots (``active_slots``) in its database and ties
each acquisition to a *lease* that the holder renews while it runs. When the holder dies
without releasing (SIGKILL, the OOM killer, a reboot), only the lease can give the slots
back, and with Prefect 3.9:

- a long-lived server (``prefect server start``) runs the *repossessor*, which frees a lease
  that has not been renewed for its duration -- as long as the server still knows the lease:
  its default lease storage is in memory, so a restarted server forgets every lease while
  ``active_slots`` stays in the database;
- the temporary server a command starts when ``PREFECT_API_URL`` is unset runs no
  repossessor at all, and dies with (or is orphaned by) the command that started it; the next
  command starts a new one, which never knew the lease.

Either way the slot stays taken, and every later run waits for it forever. So eyas records
every holding beside the limit, as a Prefect Variable ``eyas-slot-<lease id>`` (tag
``eyas-slot``; visible in the UI under *Variables*): the limits and slots, the lease, the
flow and task run, and the process (host, pid, the process's start time, the machine's boot
id). A run about to wait for a slot, and every `tasks.limits.WAIT_LOG_S` while it waits, looks
at the records of its limits: a record whose process is certainly gone from this machine (pid
not running, or running but started at another time: a reused pid; or the machine rebooted
since) is claimed -- deleting the variable, which only one claimant can do -- and its lease
released, which gives its slots back. A record of another machine cannot be judged from here;
its lease does that job on a long-lived server.

Slots that no record accounts for (a holder killed between taking its slots and writing its
record, an eyas that kept no records, a server that forgot the lease) are judged by the leases
when the server is the temporary one keeping them on disk (`reclaim_orphans`): a lease past its
expiry is released (what a long-lived server's repossessor does), and slots that no lease on
disk accounts for, twice in a row a few seconds apart, are taken off the count.

Releasing a lease the server does not know is a no-op, so the server's lease storage must
outlive it: `tasks.temporary_server` makes the temporary server keep leases on disk
(``PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE``), and docs/prefect.md says how to start a
long-lived server the same way.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RECORD_TAG = "eyas-slot"
"""Tag of every holder record (a Prefect Variable)."""
RECORD_PREFIX = "eyas-slot-"
"""Name of a holder record: this prefix, then the lease id."""
_PAGE = 200


# -- this process, and whether a recorded one still runs ---------------------------------------
def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _boot_id() -> str | None:
    """Changes at every boot of the machine (Linux); None elsewhere."""
    return _read("/proc/sys/kernel/random/boot_id")


def _pid_namespace() -> str | None:
    """The pid namespace of this process (containers sharing a host name differ here)."""
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return None


def _start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot, /proc/<pid>/stat field 22); None when no
    such process runs (a zombie counts as gone) or /proc is not there."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)", which may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass(frozen=True)
class ProcessRef:
    """Enough to tell, later and from another process, whether this process still runs."""

    host: str
    pid: int
    started: int | None = None
    """Start time of the process (clock ticks after boot), against pid reuse; None off Linux."""
    boot_id: str | None = None
    pid_ns: str | None = None

    @classmethod
    def current(cls) -> ProcessRef:
        pid = os.getpid()
        return cls(host=socket.gethostname(), pid=pid, started=_start_ticks(pid),
                   boot_id=_boot_id(), pid_ns=_pid_namespace())

    def is_gone(self) -> bool | None:
        """True when this process certainly no longer runs, False when it runs, None when it
        cannot be told from here (another machine, or another pid namespace)."""
        here = ProcessRef.current()
        if self.host != here.host:
            return None
        if self.boot_id and here.boot_id and self.boot_id != here.boot_id:
            return True  # the machine rebooted since
        if self.pid_ns != here.pid_ns:
            return None
        if here.started is not None or Path("/proc").is_dir():
            started = _start_ticks(self.pid)
            return started is None or (self.started is not None and started != self.started)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def text(self) -> str:
        return f"host {self.host}, pid {self.pid}"


# -- the record ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SlotHolder:
    """One holding of slots: what `tasks.limits.hold_slots` writes while it holds them."""

    lease_id: str
    limits: list[str]
    occupy: int
    process: ProcessRef
    since: str
    """When the slots were taken (ISO 8601, UTC)."""
    flow_run_id: str | None = None
    flow_run_name: str | None = None
    task_run_name: str | None = None
    command: str | None = None
    """The holder's command line (shortened): which run, which workdir."""

    @property
    def record_name(self) -> str:
        return RECORD_PREFIX + self.lease_id

    def to_value(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> SlotHolder:
        data = dict(value)
        data["process"] = ProcessRef(**data["process"])
        return cls(**data)

    def held_for_s(self, now: _dt.datetime | None = None) -> float:
        now = now or _dt.datetime.now(_dt.timezone.utc)
        return (now - _dt.datetime.fromisoformat(self.since)).total_seconds()

    def text(self) -> str:
        """Who this is, for a person: flow run, task, host, pid, since when, its command."""
        who = f"flow run {self.flow_run_name!r}" if self.flow_run_name else "a process outside any flow run"
        if self.task_run_name:
            who += f" (task {self.task_run_name!r})"
        since = _dt.datetime.fromisoformat(self.since)
        command = f", running `{self.command}`" if self.command else ""
        return (f"{who} on {self.process.text()}, since {since:%Y-%m-%d %H:%M:%S} UTC "
                f"({duration(self.held_for_s())}){command}")


def duration(seconds: float) -> str:
    """``45 s``, ``7 min 12 s``, ``3 h 05 min``."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def new_holder(lease_id: str, limits: list[str], occupy: int) -> SlotHolder:
    """The record of slots this process just took (naming the current flow and task run)."""
    from prefect.context import FlowRunContext, TaskRunContext

    flow_ctx, task_ctx = FlowRunContext.get(), TaskRunContext.get()
    flow_run = flow_ctx.flow_run if flow_ctx is not None else None
    return SlotHolder(
        lease_id=str(lease_id), limits=list(limits), occupy=occupy,
        process=ProcessRef.current(),
        since=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        flow_run_id=str(flow_run.id) if flow_run else None,
        flow_run_name=flow_run.name if flow_run else None,
        task_run_name=task_ctx.task_run.name if task_ctx is not None else None,
        command=command_line(),
    )


COMMAND_CHARS = 300
"""At most this much of a holder's command line is recorded."""


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a person would type it (``eyas train --config ... --workdir
    ...``: the ``python -m eyas.cli`` of the entry point shown as ``eyas``), shortened."""
    import shlex
    import sys

    args = list(sys.argv if argv is None else argv)
    if args and Path(args[0]).name in ("cli.py", "eyas"):
        args = ["eyas", *args[1:]]
    text = shlex.join(args)
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 3] + "..."


# -- records on the server -----------------------------------------------------------------
def write_record(client: Any, holder: SlotHolder) -> None:
    """Store `holder` as its Prefect Variable."""
    from prefect.client.schemas.actions import VariableCreate

    client.create_variable(VariableCreate(name=holder.record_name, value=holder.to_value(),
                                          tags=[RECORD_TAG]))


def delete_record(client: Any, holder: SlotHolder) -> bool:
    """Delete `holder`'s record; False when it was already gone (another run claimed it)."""
    from prefect.exceptions import ObjectNotFound

    try:
        client.delete_variable_by_name(holder.record_name)
    except ObjectNotFound:
        return False
    return True


def read_holders(client: Any, limit_names: list[str] | None = None) -> list[SlotHolder]:
    """Every holder record (of the limits named, when given), oldest first. A record that does
    not parse (written by hand, or by another version) is skipped."""
    out: list[SlotHolder] = []
    offset = 0
    while True:
        page = client.request("POST", "/variables/filter", json={
            "variables": {"tags": {"all_": [RECORD_TAG]}}, "limit": _PAGE, "offset": offset,
        }).json()
        for var in page:
            if not str(var.get("name", "")).startswith(RECORD_PREFIX):
                continue
            try:
                holder = SlotHolder.from_value(var["value"])
            except (TypeError, KeyError, ValueError):
                continue
            if limit_names is None or set(holder.limits) & set(limit_names):
                out.append(holder)
        if len(page) < _PAGE:
            break
        offset += _PAGE
    return sorted(out, key=lambda h: h.since)


def reclaim_dead(client: Any, limit_names: list[str] | None = None) -> list[SlotHolder]:
    """Give back the slots of every recorded holder (of the limits named) whose process is
    certainly gone from this machine; return those holders.

    Each is claimed by deleting its record (a concurrent run that loses the race skips it),
    then its lease is released: the server decrements the limits and revokes the lease, or does
    nothing when the lease was already released or revoked.
    """
    freed = []
    for holder in read_holders(client, limit_names):
        if holder.process.is_gone() is not True:
            continue
        if not delete_record(client, holder):
            continue
        client.release_concurrency_slots_with_lease(lease_id=holder.lease_id)
        freed.append(holder)
    return freed


# -- slots with no record: judged by the leases on disk --------------------------------------
ORPHAN_RECHECK_S = 2.0
"""Seconds between the two looks that must both find a slot unaccounted for before it is freed
(a holder takes its slots and its lease in one request to the server)."""


def _leases(lease_dir: Path) -> list[dict]:
    """The lease files of Prefect's filesystem lease storage (unreadable ones skipped)."""
    import json

    out = []
    for path in sorted(lease_dir.glob("*.json")):
        if path.name == "expirations.json":
            continue
        try:
            data = json.loads(path.read_text())
            out.append({"id": str(data["id"]), "limits": {str(r) for r in data["resource_ids"]},
                        "slots": int((data.get("metadata") or {}).get("slots", 1)),
                        "expiration": _dt.datetime.fromisoformat(data["expiration"])})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def unaccounted_slots(client: Any, names: list[str], lease_dir: Path) -> dict[str, int]:
    """{limit: slots in use beyond what the unexpired leases in `lease_dir` account for}, for
    the limits in `names` that have any."""
    now = _dt.datetime.now(_dt.timezone.utc)
    leases = [lease for lease in _leases(lease_dir) if lease["expiration"] >= now]
    out = {}
    for name in names:
        limit = client.read_global_concurrency_limit_by_name(name)
        known = sum(lease["slots"] for lease in leases if str(limit.id) in lease["limits"])
        if limit.active_slots > known:
            out[name] = limit.active_slots - known
    return out


def reclaim_orphans(client: Any, names: list[str], lease_dir: Path,
                    recheck_s: float = ORPHAN_RECHECK_S) -> list[str]:
    """Free what no live holder can hold, when the server keeps its leases in `lease_dir`;
    return one line per action taken.

    A lease of these limits past its expiry (not renewed: its holder is dead or hung for the
    whole lease) is released. Then slots that no unexpired lease accounts for (an expired lease
    the server did not know included), found on two looks `recheck_s` apart, are taken off the
    limit's count.
    """
    import time

    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    done = []
    ids = {str(client.read_global_concurrency_limit_by_name(n).id): n for n in names}
    now = _dt.datetime.now(_dt.timezone.utc)
    for lease in _leases(lease_dir):
        mine = sorted(ids[i] for i in lease["limits"] if i in ids)
        if mine and lease["expiration"] < now:
            client.release_concurrency_slots_with_lease(lease_id=lease["id"])
            done.append(f"released lease {lease['id']} of {', '.join(mine)} ({lease['slots']} "
                        f"slot(s)): expired {lease['expiration']:%Y-%m-%d %H:%M:%S} UTC, not "
                        "renewed by its holder")
    first = unaccounted_slots(client, names, lease_dir)
    if not first:
        return done
    time.sleep(recheck_s)
    second = unaccounted_slots(client, names, lease_dir)
    for name in names:
        n = min(first.get(name, 0), second.get(name, 0))
        if n <= 0:
            continue
        active = client.read_global_concurrency_limit_by_name(name).active_slots
        client.update_global_concurrency_limit(
            name, GlobalConcurrencyLimitUpdate(active_slots=max(0, active - n)))
        done.append(f"freed {n} slot(s) of {name} that no lease accounts for (a holder that "
                    "died before recording itself, or a server that forgot its lease)")
    return done

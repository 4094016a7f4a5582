"""Prefect global concurrency limits that bound the work sent to one host.

Two limits per host, created on first use (a missing limit would only warn):
- ``eyas-host-<host>``: remote jobs of any kind at once (merge, deletion, probes...);
- ``eyas-gpu-<host>``: GPU jobs at once, one per GPU (at least 1, for CPU-only hosts).

`hold_slots` takes slots the way Prefect's ``concurrency()`` does (a lease on the server,
renewed while the block runs, released at its end), and adds what a multi-day pipeline needs:

- the slots of a holder that died without releasing them come back by themselves: every
  holding is recorded (`tasks.slot_holders`), and a run that finds a limit full gives back
  the slots of recorded holders whose process is gone from this machine; on a long-lived
  server the lease's expiry does the same for holders on other machines;
- a run waiting for a slot says so at once and every `WAIT_LOG_S`: which limit, how full,
  who holds it (flow run, task, host, pid, its command line, since when) and how long it has
  waited. A limit is per host, not per run: every run that uses the same Prefect server (by
  default the temporary one under ``PREFECT_HOME``) shares it, so an unrelated run's
  training holds this machine's GPU slot -- its command names its workdir;
- a stop (SIGTERM, Ctrl-C: `eyas.stopping`) ends the wait within a second.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from eyas import stopping
from eyas.errors import ConfigError
from eyas.remote.hosts import HostSpec
from tasks.slot_holders import (
    delete_record,
    duration,
    new_holder,
    read_holders,
    reclaim_dead,
    reclaim_orphans,
    write_record,
)
from tasks.temporary_server import leases_on_disk, persistent_leases

HOST_JOBS = 4
"""Remote jobs of any kind that may run at once on one host."""
LEASE_S = 120.0
"""Lease of a holding: renewed every quarter of it; a long-lived server frees the slots of a
holder that stopped renewing this long ago (Prefect's minimum is 60 s)."""
WAIT_LOG_S = 30.0
"""How often a run waiting for a slot logs who holds it (and looks for dead holders)."""
persistent_leases()  # at import: before any flow of this process starts a temporary server


def _slug(spec: HostSpec) -> str:
    where = "local" if spec.kind == "local" else f"{spec.host}-{spec.port}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", where)


def host_limit_name(spec: HostSpec) -> str:
    return f"eyas-host-{_slug(spec)}"


def gpu_limit_name(spec: HostSpec) -> str:
    return f"eyas-gpu-{_slug(spec)}"


def ensure_limit(name: str, limit: int) -> None:
    """Create the global concurrency limit `name` with `limit` slots unless it exists.

    An existing limit is left as the operator set it (the UI may have changed it).
    """
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with contextlib.suppress(ObjectAlreadyExists):  # another run created it meanwhile
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=limit))


@contextlib.contextmanager
def host_slot(spec: HostSpec, *, gpu: bool = False) -> Iterator[None]:
    """Hold one slot of the host's job limit (and of its GPU limit when `gpu`)."""
    names = [host_limit_name(spec)]
    ensure_limit(names[0], HOST_JOBS)
    if gpu:
        names.append(gpu_limit_name(spec))
        ensure_limit(names[1], max(1, spec.num_gpus))
    with hold_slots(names):
        yield


def _logger() -> logging.Logger | logging.LoggerAdapter:
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("eyas.slots")


@contextlib.contextmanager
def hold_slots(names: list[str], occupy: int = 1, *, lease_s: float = LEASE_S,
               wait_log_s: float = WAIT_LOG_S) -> Iterator[None]:
    """Hold `occupy` slots of every limit in `names` (all at once) while the block runs.

    Waits as long as it takes, logging every `wait_log_s` who holds the slots, and giving
    back those of recorded holders that died on this machine. Raises ConfigError when a limit
    is missing or has fewer than `occupy` slots (waiting could never end);
    `eyas.stopping.StopRequested` within a second of a stop request while it waits (the
    slots it holds are released as the block is left, a stop included).
    """
    if not names:
        yield
        return
    logger = _logger()
    with get_client(sync_client=True) as client:
        lease_id = _acquire(client, names, occupy, lease_s, wait_log_s, logger)
        holder = new_holder(lease_id, names, occupy)
        try:
            write_record(client, holder)
            with _renewing(lease_id, lease_s, names, logger):
                yield
        finally:
            try:
                client.release_concurrency_slots_with_lease(lease_id=lease_id)
                delete_record(client, holder)
            except (httpx.HTTPError, OSError) as exc:
                logger.warning("could not release the slots of %s (lease %s): %s; the next run "
                               "that waits for them gives them back once this process is gone",
                               ", ".join(names), lease_id, exc)


def _acquire(client: Any, names: list[str], occupy: int, lease_s: float, wait_log_s: float,
             logger: Any) -> str:
    """Take the slots (returning the lease id), waiting and saying so while they are held."""
    start = time.monotonic()
    next_log = start
    while True:
        lease_id, retry_after = _try_acquire(client, names, occupy, lease_s)
        now = time.monotonic()
        if lease_id is not None:
            if now - start >= 1.0:
                logger.info("got %d slot(s) of %s after waiting %s", occupy, ", ".join(names),
                            duration(now - start))
            return lease_id
        if now >= next_log:
            freed = reclaim_dead(client)  # every limit's: a dead run held more than this one
            for h in freed:
                logger.warning("gave back %d slot(s) of %s held by %s: that process is gone "
                               "(killed, or its machine restarted)", h.occupy, ", ".join(h.limits),
                               h.text())
            lease_dir = leases_on_disk()
            orphans = reclaim_orphans(client, names, lease_dir) if lease_dir else []
            for line in orphans:
                logger.warning("%s", line)
            if freed or orphans:
                continue
            logger.warning("%s", waiting_text(client, names, occupy, now - start))
            next_log = now + wait_log_s
        # A stop (SIGTERM, Ctrl-C, seen from this worker thread) ends the wait at once: no
        # slot taken, none to give back.
        if stopping.wait(max(0.2, min(retry_after, 5.0, next_log - now))):
            stopping.check(f"while waiting {duration(time.monotonic() - start)} for "
                           f"{occupy} slot(s) of {', '.join(names)}")


def _try_acquire(client: Any, names: list[str], occupy: int,
                 lease_s: float) -> tuple[str | None, float]:
    """One try: ``(lease id, 0)`` when taken, ``(None, seconds to wait)`` when full."""
    try:
        resp = client.increment_concurrency_slots_with_lease(
            names=names, slots=occupy, mode="concurrency", lease_duration=lease_s,
            holder=_prefect_holder())
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 423:
            try:
                return None, float(exc.response.headers.get("Retry-After", 1.0))
            except ValueError:
                return None, 1.0
        if exc.response.status_code == 422:
            raise ConfigError(f"cannot take {occupy} slot(s) of {', '.join(names)}: "
                              f"{_detail(exc)} (raise the limit in the Prefect UI, Concurrency)",
                              where=", ".join(names)) from None
        raise
    body = resp.json()
    missing = sorted(set(names) - {limit["name"] for limit in body.get("limits", [])})
    if missing:
        client.release_concurrency_slots_with_lease(lease_id=body["lease_id"])
        raise ConfigError(f"the global concurrency limit(s) {missing} do not exist; eyas creates "
                          "them before use (tasks.limits.ensure_limit)", where=", ".join(missing))
    return str(body["lease_id"]), 0.0


def _detail(exc: httpx.HTTPStatusError) -> str:
    try:
        return str(exc.response.json().get("detail", exc.response.text))
    except ValueError:
        return exc.response.text


def _prefect_holder() -> Any:
    """Prefect's own note of who holds a lease: the task run, else the flow run."""
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.context import FlowRunContext, TaskRunContext

    if (task_ctx := TaskRunContext.get()) is not None:
        return ConcurrencyLeaseHolder(type="task_run", id=task_ctx.task_run.id)
    if (flow_ctx := FlowRunContext.get()) is not None and flow_ctx.flow_run is not None:
        return ConcurrencyLeaseHolder(type="flow_run", id=flow_ctx.flow_run.id)
    return None


def waiting_text(client: Any, names: list[str], occupy: int, waited_s: float) -> str:
    """What a waiting run logs: per full limit, its use and who holds it; how long it waited."""
    holders = read_holders(client, names)
    limits = {n: client.read_global_concurrency_limit_by_name(n) for n in names}
    full = [n for n in names if limits[n].active_slots + occupy > limits[n].limit] or names
    parts = []
    for name in full:
        limit = limits[name]
        mine = [h for h in holders if name in h.limits]
        text = f"{name} has {limit.active_slots}/{limit.limit} slot(s) in use"
        if mine:
            text += ", held by " + "; ".join(h.text() for h in mine)
        unrecorded = limit.active_slots - sum(h.occupy for h in mine)
        if unrecorded > 0:
            text += (f"; {unrecorded} slot(s) held with no eyas record (work outside eyas, or a "
                     "holder that died while the server forgot its lease: a server with its "
                     "lease storage in memory that restarted). If nothing runs there, free them "
                     f"with: prefect gcl update {name} --active-slots "
                     f"{max(0, limit.active_slots - unrecorded)}")
        parts.append(text)
    return (f"waiting for {occupy} slot(s) of {', '.join(names)} (waited {duration(waited_s)}): "
            + " | ".join(parts))


@contextlib.contextmanager
def _renewing(lease_id: str, lease_s: float, names: list[str], logger: Any) -> Iterator[None]:
    """Renew the lease every quarter of `lease_s` in a thread while the block runs.

    A lease the server no longer knows (revoked) is logged as an error and no longer renewed;
    the work goes on (stopping a multi-day job for a bookkeeping failure would cost more).
    """
    stop = threading.Event()

    def renew() -> None:
        failures = 0
        with get_client(sync_client=True) as client:
            while not stop.wait(lease_s / 4):
                try:
                    client.renew_concurrency_lease(lease_id=lease_id, lease_duration=lease_s)
                    failures = 0
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code == 410:
                        logger.error("the lease on %s (%s) was revoked while this work still "
                                     "runs: other work may now take these slots",
                                     ", ".join(names), lease_id)
                        return
                    failures += 1
                except (httpx.HTTPError, OSError) as exc:
                    failures += 1
                    if failures == 3:
                        logger.warning("cannot renew the lease on %s (%s): %s", ", ".join(names),
                                       lease_id, exc)

    # The thread sees this context's settings (the API URL of a test harness, say).
    ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(renew,), daemon=True,
                              name=f"eyas-slot-lease-{lease_id}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


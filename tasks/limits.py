"""The slots that bound the work sent to one host: a thin wrapper over `eyas.slots`.

Two pools per host, created on first use (`eyas.slots.ensure_pool`, under this machine's
`eyas.slots.slots_root`):
- ``eyas-host-<host>``: remote jobs of any kind at once (merge, deletion, probes...);
- ``eyas-gpu-<host>``: GPU jobs at once, one per GPU (at least 1, for CPU-only hosts).

A slot is a ``flock`` held by the eyas process doing the work (for a host over SSH, the one
driving it): the kernel frees it however that process ends, SIGKILL included. This module
adds only what a task knows: the holder's flow run and task (written into the slot, named by
a run that waits for it) and the task's logger. Prefect's own concurrency limits are not used.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path

from eyas import slots
from eyas.remote.hosts import HostSpec

HOST_JOBS = 4
"""Remote jobs of any kind that may run at once on one host."""
WAIT_LOG_S = slots.WAIT_LOG_S


def _slug(spec: HostSpec) -> str:
    where = "local" if spec.kind == "local" else f"{spec.host}-{spec.port}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", where)


def host_pool_name(spec: HostSpec) -> str:
    return f"eyas-host-{_slug(spec)}"


def gpu_pool_name(spec: HostSpec) -> str:
    return f"eyas-gpu-{_slug(spec)}"


def ensure_pool(name: str, size: int) -> Path:
    """Create the pool `name` with `size` slots unless it exists (an existing pool is left as
    the operator set it)."""
    return slots.ensure_pool(name, size)


def pool_size(name: str) -> int:
    """The slots of the pool `name` (0 when it does not exist)."""
    folder = slots.pool_dir(name)
    return len(slots.pool_slots(folder)) if folder.is_dir() else 0


@contextlib.contextmanager
def host_slot(spec: HostSpec, *, gpu: bool = False) -> Iterator[None]:
    """Hold one slot of the host's job pool (and of its GPU pool when `gpu`)."""
    names = {ensure_pool(host_pool_name(spec), HOST_JOBS).name: 1}
    if gpu:
        names[ensure_pool(gpu_pool_name(spec), max(1, spec.num_gpus)).name] = 1
    with hold_slots(names):
        yield


def _logger() -> logging.Logger | logging.LoggerAdapter:
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("eyas.slots")


def _who() -> str | None:
    """The current flow run and task, as a waiting run names a holder."""
    from prefect.context import FlowRunContext, TaskRunContext

    flow_ctx, task_ctx = FlowRunContext.get(), TaskRunContext.get()
    flow_run = flow_ctx.flow_run if flow_ctx is not None else None
    if flow_run is None:
        return None
    who = f"flow run {flow_run.name!r}"
    if task_ctx is not None:
        who += f" (task {task_ctx.task_run.name!r})"
    return who


@contextlib.contextmanager
def hold_slots(names: dict[str, int], *, wait_log_s: float = WAIT_LOG_S) -> Iterator[None]:
    """Hold `names[pool]` slots of every pool named (all at once) while the block runs; see
    `eyas.slots.hold` (ConfigError for a missing or too small pool, StopRequested on a stop
    while waiting)."""
    logger = _logger()
    with slots.hold({slots.pool_dir(n): k for n, k in names.items()}, who=_who(),
                    say=lambda line: logger.warning("%s", line), wait_log_s=wait_log_s):
        yield

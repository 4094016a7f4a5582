"""Prefect global concurrency limits that bound the work sent to one host.

Two limits per host, created on first use (a missing limit would only warn):
- ``eyas-host-<host>``: remote jobs of any kind at once (merge, deletion, probes...);
- ``eyas-gpu-<host>``: GPU jobs at once, one per GPU (at least 1, for CPU-only hosts).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectNotFound

from eyas.remote.hosts import HostSpec

HOST_JOBS = 4
"""Remote jobs of any kind that may run at once on one host."""


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
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))


@contextlib.contextmanager
def host_slot(spec: HostSpec, *, gpu: bool = False) -> Iterator[None]:
    """Hold one slot of the host's job limit (and of its GPU limit when `gpu`)."""
    names = [host_limit_name(spec)]
    ensure_limit(names[0], HOST_JOBS)
    if gpu:
        names.append(gpu_limit_name(spec))
        ensure_limit(names[1], max(1, spec.num_gpus))
    with concurrency(names, occupy=1, strict=True):
        yield

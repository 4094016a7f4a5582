"""Which host a flow works on: a saved `GpuHost` block (by name, or as the flow parameter
Prefect loaded), or this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.remote.hosts import Host, HostSpec, connect


def host_spec(host_block: Any, data_root: str | None = None) -> HostSpec:
    """The host of a `GpuHost` block -- given by its saved name, as a block, as a reference
    (``{"$ref": {"block_document_id": ...}}``, how Prefect stores a block parameter) or as its
    fields -- with its data root replaced by `data_root` when given; without a block, this
    machine (data root `data_root`, default ``/data``)."""
    if host_block:
        from blocks.gpu_host import GpuHost

        if isinstance(host_block, HostSpec):
            spec = host_block.spec() if isinstance(host_block, GpuHost) else host_block
        elif isinstance(host_block, dict) and "$ref" in host_block:
            spec = GpuHost.load_from_ref(host_block["$ref"]).spec()
        elif isinstance(host_block, dict):
            spec = HostSpec.model_validate({k: v for k, v in host_block.items()
                                            if k in HostSpec.model_fields})
        else:
            spec = GpuHost.load(host_block).spec()
        return spec.model_copy(update={"data_root": data_root}) if data_root else spec
    return HostSpec.local(data_root=data_root or "/data")


def open_host(host: HostSpec | None) -> Host:
    """The `Host` a task works on: `host`'s, or this machine's (`LocalHost`) for None. Every
    read, write, check and link of a task goes through it, so that a phase is written once for
    here and for a GPU host."""
    return connect(host or HostSpec.local(data_root="/"))


def eyas_python(host: HostSpec | None) -> str:
    """The Python that runs eyas's entry points on `host` (its eyas venv's), or here (the
    interpreter running now)."""
    return (host or HostSpec.local()).eyas_python


def remote_host(host_block: Any) -> HostSpec | None:
    """The SSH host of a saved `GpuHost` block; None for no block or a local one (work runs
    in this process then)."""
    spec = host_spec(host_block) if host_block else None
    return None if spec is None or spec.kind == "local" else spec


def resolve_run(workdir: str, host_block: Any,
                gpu_env: dict[str, str] | None = None) -> tuple[str, HostSpec | None]:
    """A GPU flow's workdir (absolute when local; a remote one is a path on the host, kept as
    given) and SSH host (None: this machine), whose ``gpu_env`` takes the recipe's `gpu_env`
    over the block's: every job started there runs with it."""
    host = remote_host(host_block)
    if host is None:
        workdir = str(Path(workdir).resolve())
    elif gpu_env:
        host = host.model_copy(update={"gpu_env": {**host.gpu_env, **gpu_env}})
    return workdir, host



def run_lock(workdir: str, host: HostSpec | None, flow: str):
    """The run folder's lock for the flow run's duration (`eyas.workdir_lock`), so that two
    flow runs, or a flow run and an ``eyas`` command, never write into one folder at once; the
    refused one fails with WorkdirBusy naming the holder. On this machine (`host` None, or a
    local one) ``<workdir>/.eyas-lock``; on an SSH host the same file there, held through an
    SSH channel of its own for as long as the flow runs. Re-entrant in one process (``eyas
    pipeline`` holds it and runs its flow in process)."""
    from eyas.remote.workdir_lock import host_workdir_lock
    from eyas.workdir_lock import workdir_lock

    if host is None or host.kind == "local":
        return workdir_lock(Path(workdir), f"flow {flow}")
    return host_workdir_lock(host, workdir, f"flow {flow}")

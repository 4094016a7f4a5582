"""Which host a flow works on: a saved `GpuHost` block, or this machine."""

from __future__ import annotations

from pathlib import Path

from eyas.remote.hosts import HostSpec


def host_spec(host_block: str | None, data_root: str | None = None) -> HostSpec:
    """The host of a saved `GpuHost` block (its data root replaced by `data_root` when given),
    or, without a block, this machine (data root `data_root`, default ``/data``)."""
    if host_block:
        from blocks.gpu_host import GpuHost

        spec = GpuHost.load(host_block).spec()
        return spec.model_copy(update={"data_root": data_root}) if data_root else spec
    return HostSpec.local(data_root=data_root or "/data")


def remote_host(host_block: str | None) -> HostSpec | None:
    """The SSH host of a saved `GpuHost` block; None for no block or a local one (work runs
    in this process then)."""
    spec = host_spec(host_block) if host_block else None
    return None if spec is None or spec.kind == "local" else spec


def resolve_run(config_path: str, workdir: str, host_block: str | None) -> tuple[str, str, HostSpec | None]:
    """A GPU flow's config path (absolute), workdir (absolute when local; a remote one is a
    path on the host, kept as given) and SSH host (None: this machine)."""
    host = remote_host(host_block)
    if host is None:
        workdir = str(Path(workdir).resolve())
    return str(Path(config_path).resolve()), workdir, host

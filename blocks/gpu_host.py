"""`GpuHost`: a Prefect block naming a GPU host (or this machine), saved once, used by name.

    GpuHost(host="192.0.2.10", user="train", key_filename="~/.ssh/eyas_ed25519",
            known_hosts="~/.ssh/known_hosts", data_root="/data", num_gpus=8,
            python="python3.11").save("gpu-8x")   # the interpreter venvs are built with
    spec = GpuHost.load("gpu-8x").spec()      # a plain HostSpec: what tasks pass around

The block's fields are `eyas.remote.hosts.HostSpec`'s own (with their descriptions): one
definition for the UI form, the block and the plain data. ``kind="local"`` is this machine.
Tasks receive the `HostSpec` (plain data) and open their own connection with
`eyas.remote.hosts.connect(spec)`; never pass a Fabric `Connection` between tasks.

A flow parameter typed `GpuHost` is drawn in the Prefect UI as a list of the saved hosts
(the block type must be registered on the server: `register` does it, and so does
``python -m deployments.serve``); where a name is given instead (the CLI, a script), the block
of that name is loaded.
"""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from pydantic import ConfigDict, model_validator

from eyas.remote.hosts import HostSpec


class GpuHost(HostSpec, Block):
    """A host eyas runs phases on: over SSH with a verified host key, or this machine."""

    model_config = ConfigDict(extra="forbid")
    _block_type_name = "eyas GPU host"
    _description = "Where eyas runs a phase: SSH address, keys, verified host key, data root."

    @model_validator(mode="before")
    @classmethod
    def _by_name(cls, data: Any) -> Any:
        """A saved block's name where a host is expected is that block."""
        if isinstance(data, str):
            return cls.load(data).spec().model_dump()
        return data

    def spec(self) -> HostSpec:
        """The plain `HostSpec` for this block (safe to pass to Prefect tasks)."""
        return HostSpec.model_validate({name: getattr(self, name) for name in HostSpec.model_fields})


def register() -> None:
    """Register the block type on the Prefect server (idempotent), so its form and the list of
    saved hosts appear in the UI."""
    GpuHost.register_type_and_schema()

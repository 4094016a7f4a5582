"""`GpuHost`: a Prefect block naming a GPU host (or this machine), saved once, used by name.

    GpuHost(host="192.0.2.10", user="train", key_filename="~/.ssh/eyas_ed25519",
            known_hosts="~/.ssh/known_hosts", data_root="/data", num_gpus=8).save("gpu-8x")
    spec = GpuHost.load("gpu-8x").spec()      # a plain HostSpec: what tasks pass around

The block's fields are `eyas.remote.hosts.HostSpec`'s own (with their descriptions): one
definition for the UI form, the block and the plain data. ``kind="local"`` is this machine.
Tasks receive the `HostSpec` (plain data) and open their own connection with
`eyas.remote.hosts.connect(spec)`; never pass a Fabric `Connection` between tasks.
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import ConfigDict

from eyas.remote.hosts import HostSpec


class GpuHost(HostSpec, Block):
    """A host eyas runs phases on: over SSH with a verified host key, or this machine."""

    model_config = ConfigDict(extra="forbid")
    _block_type_name = "eyas GPU host"
    _description = "Where eyas runs a phase: SSH address, keys, verified host key, data root."

    def spec(self) -> HostSpec:
        """The plain `HostSpec` for this block (safe to pass to Prefect tasks)."""
        return HostSpec.model_validate({name: getattr(self, name) for name in HostSpec.model_fields})

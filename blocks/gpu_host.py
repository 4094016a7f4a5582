"""`GpuHost`: a Prefect block naming a GPU host (or this machine), saved once, used by name.

    GpuHost(host="192.0.2.10", user="train", key_filename="~/.ssh/eyas_ed25519",
            known_hosts="~/.ssh/known_hosts", data_root="/data", num_gpus=8).save("gpu-8x")
    spec = GpuHost.load("gpu-8x").spec()      # a plain HostSpec: what tasks pass around

Tasks receive the `HostSpec` (plain data) and open their own connection with
`eyas.remote.hosts.connect(spec)`; never pass a Fabric `Connection` between tasks.
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from eyas.remote.hosts import HostSpec


class GpuHost(Block):
    """A host eyas runs phases on: over SSH with a verified host key, or this machine."""

    _block_type_name = "eyas GPU host"
    _description = "Where eyas runs a phase: SSH address, keys, verified host key, data root."

    local: bool = Field(False, description="This machine, no SSH (the other SSH fields are ignored).")
    host: str = Field("localhost", description="Address or name of the host.")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str | None = Field(None, description="Login user; default: the local user name.")
    key_filename: str | None = Field(None, description="Private key file on the machine running the flow.")
    key_passphrase: SecretStr | None = Field(None, description="Passphrase of the key, if any.")
    known_hosts: str | None = Field("~/.ssh/known_hosts", description="known_hosts file holding the host's key.")
    host_key: str | None = Field(None, description='Pinned host key "ssh-ed25519 AAAA..." (wins over known_hosts).')
    data_root: str = Field("/data", description="Folder eyas may write to and delete from on the host.")
    python: str = Field("python3", description="Python on the host used for probes.")
    venv: str | None = Field(None, description="venv eyas is shipped into; default <data_root>/.eyas/venv.")
    num_gpus: int = Field(0, ge=0, description="GPUs on the host.")
    connect_timeout: float = Field(10.0, gt=0, description="Seconds to wait when connecting.")

    def spec(self) -> HostSpec:
        """The plain `HostSpec` for this block (safe to pass to Prefect tasks)."""
        return HostSpec(
            kind="local" if self.local else "ssh", host=self.host, port=self.port, user=self.user,
            key_filename=self.key_filename, key_passphrase=self.key_passphrase,
            known_hosts=None if self.local else self.known_hosts, host_key=self.host_key,
            data_root=self.data_root, python=self.python, venv=self.venv,
            num_gpus=self.num_gpus, connect_timeout=self.connect_timeout,
        )

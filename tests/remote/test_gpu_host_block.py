"""The GpuHost Prefect block turns into a plain HostSpec (no Prefect server needed)."""

from __future__ import annotations

from blocks.gpu_host import GpuHost
from eyas.remote.hosts import LocalHost, SSHHost, connect


def test_block_to_spec():
    block = GpuHost(host="192.0.2.10", user="train", key_filename="~/.ssh/k",
                    key_passphrase="s3cret", data_root="/data", num_gpus=8)
    spec = block.spec()
    assert (spec.kind, spec.host, spec.user, spec.num_gpus) == ("ssh", "192.0.2.10", "train", 8)
    assert spec.key_passphrase.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(spec)
    assert isinstance(connect(spec), SSHHost)  # not opened: nothing is sent
    assert isinstance(connect(GpuHost(local=True, data_root="/tmp").spec()), LocalHost)

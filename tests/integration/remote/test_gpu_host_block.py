"""The GpuHost Prefect block turns into a plain HostSpec (no Prefect server needed), and its
fields are HostSpec's own."""

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
    assert isinstance(connect(GpuHost(kind="local", data_root="/tmp").spec()), LocalHost)


def test_block_fields_are_the_host_specs_with_their_descriptions():
    from eyas.remote.hosts import HostSpec

    assert set(GpuHost.model_fields) >= set(HostSpec.model_fields)
    for name, field in HostSpec.model_fields.items():
        assert GpuHost.model_fields[name].description == field.description, name
    spec = HostSpec(host="192.0.2.10", venv="/opt/eyas", python="/usr/bin/python3", num_gpus=8)
    assert GpuHost(**spec.model_dump()).spec() == spec

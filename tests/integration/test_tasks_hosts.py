"""tasks.hosts: which host a flow works on (a saved GpuHost block, or this machine)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from tasks.hosts import host_spec, remote_host, resolve_run


def test_without_a_block_it_is_this_machine(tmp_path):
    spec = host_spec(None, str(tmp_path))
    assert (spec.kind, spec.data_root, spec.python) == ("local", str(tmp_path), sys.executable)
    assert spec.eyas_python == sys.executable  # eyas is importable here
    assert host_spec(None).data_root == "/data"
    assert remote_host(None) is None


def test_a_block_gives_its_spec_and_a_local_block_runs_here(tmp_path, prefect_harness):
    from blocks.gpu_host import GpuHost

    ssh, local = f"ssh-{uuid.uuid4().hex[:8]}", f"local-{uuid.uuid4().hex[:8]}"
    GpuHost(host="192.0.2.10", user="train", venv="/opt/eyas", num_gpus=8).save(ssh)
    GpuHost(kind="local", data_root=str(tmp_path)).save(local)
    spec = host_spec(ssh, data_root="/scratch")
    assert (spec.host, spec.data_root, spec.eyas_python) == ("192.0.2.10", "/scratch",
                                                             "/opt/eyas/bin/python")
    assert remote_host(ssh).num_gpus == 8
    assert remote_host(local) is None
    workdir, host = resolve_run("run", ssh)
    assert (workdir, host.host) == ("run", "192.0.2.10")
    workdir, host = resolve_run("run", None)
    assert host is None and workdir == str(Path("run").resolve())

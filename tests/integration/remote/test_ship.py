"""Shipping eyas into a venv on a host: installed once, skipped when unchanged."""

from __future__ import annotations

import pytest

from eyas.remote.hosts import HostSpec, LocalHost
from eyas.remote.ship import REPO, ship, snapshot, source_hash


def test_source_hash_is_stable():
    assert source_hash() == source_hash() and len(source_hash()) == 64


@pytest.mark.slow
def test_local_ship_is_idempotent(tmp_path):
    host = LocalHost(HostSpec(kind="local", data_root=str(tmp_path), known_hosts=None))
    venv = str(tmp_path / "venv")
    repo = snapshot(REPO, tmp_path / "checkout")  # frozen: other edits cannot race the test
    # install_deps=False: no registry needed; the core's import check runs in the venv
    # with eyas alone, so it must not import heavy dependencies at module import time.
    assert ship(host, venv=venv, install_deps=False, repo=repo) == "installed"
    assert ship(host, venv=venv, install_deps=False, repo=repo) == "skipped"
    assert host.run(f"{venv}/bin/python -c 'import eyas; print(eyas.__version__)'").stdout.strip()

"""Folder transfers verified by checksum, on LocalHost and over SSH."""

from __future__ import annotations

import pytest

from eyas.errors import RemoteError
from eyas.remote.hosts import HostSpec, LocalHost, SSHHost
from eyas.remote.transfer import _diff, local_checksums, parse_checksums, remote_checksums_cmd


def _tree(root):
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.jsonl").write_text('{"id": 1}\n')
    (root / "sub" / "b name.bin").write_bytes(bytes(range(256)) * 50)
    (root / "sub" / "deeper" / "empty").write_bytes(b"")
    return root


def test_checksum_listing_matches_sha256sum(tmp_path):
    src = _tree(tmp_path / "src")
    host = LocalHost()
    assert parse_checksums(host.run(remote_checksums_cmd(str(src))).stdout) == local_checksums(src)


def test_diff_names_each_problem():
    assert _diff({"a": "1", "b": "2"}, {"b": "3", "c": "4"}) == [
        "missing a", "unexpected c", "checksum differs: b"]


def test_local_put_get_dir_roundtrip_and_refusals(tmp_path):
    src = _tree(tmp_path / "src")
    host = LocalHost(HostSpec(kind="local", data_root=str(tmp_path), known_hosts=None))
    sums = host.put_dir(src, str(tmp_path / "remote" / "copy"))
    assert set(sums) == {"a.jsonl", "sub/b name.bin", "sub/deeper/empty"}
    with pytest.raises(RemoteError, match="already exists"):
        host.put_dir(src, str(tmp_path / "remote" / "copy"))
    (src / "a.jsonl").write_text("changed\n")
    host.put_dir(src, str(tmp_path / "remote" / "copy"), overwrite=True)
    assert (tmp_path / "remote" / "copy" / "a.jsonl").read_text() == "changed\n"
    back = host.get_dir(str(tmp_path / "remote" / "copy"), tmp_path / "back")
    assert back == local_checksums(tmp_path / "back") == local_checksums(src)
    assert not [p for p in (tmp_path / "remote").iterdir() if ".tmp-" in p.name]
    (src / "link").symlink_to(src / "a.jsonl")
    with pytest.raises(RemoteError, match="not a regular file"):
        host.put_dir(src, str(tmp_path / "remote" / "other"))


@pytest.mark.ssh
def test_ssh_put_get_dir_verified(sshd, tmp_path):
    src = _tree(tmp_path / "src")
    remote = str(sshd.data_root / "xfer" / "ds")
    with SSHHost(sshd.spec()) as host:
        sums = host.put_dir(src, remote)
        assert sums == local_checksums(src)
        assert host.get_dir(remote, tmp_path / "back") == sums
    assert local_checksums(tmp_path / "back") == local_checksums(src)

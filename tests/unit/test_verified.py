"""Remembered checksums (eyas.verified): unchanged files are not read again; changed, racy
or fully verified ones are."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
import torch

from eyas import verified
from eyas.extract.store import DATA_NAME, list_shards, write_shard
from eyas.train.data import OfflineSource

H = 8


RACY_S = 0.2
"""`verified.RACY_S` in these tests (the change time cannot be set back: tests wait it out)."""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(verified.VERIFY_ENV, raising=False)
    monkeypatch.setattr(verified, "RACY_S", RACY_S)


def _settle():
    """Wait until a file changed just now is no longer racy (its change time is `RACY_S` old)."""
    time.sleep(RACY_S * 1.5)


def _age(path, seconds=60.0, *, settle=True):
    """Make `path` look written `seconds` ago, and wait until its change time (which utime
    moves on) is no longer racy either."""
    t = time.time() - seconds
    os.utime(path, (t, t))
    if settle:
        _settle()


def _write(path, data: bytes, *, old=True):
    path.write_bytes(data)
    if old:
        _age(path)


def test_an_unchanged_file_is_hashed_once(tmp_path):
    f = tmp_path / "a.bin"
    _write(f, b"x" * 1000)
    want = hashlib.sha256(b"x" * 1000).hexdigest()
    before = verified.bytes_hashed()
    assert verified.file_sha256(f) == want
    assert verified.bytes_hashed() - before == 1000
    assert verified.file_sha256(f) == want
    assert verified.file_sha256(tmp_path / "." / "a.bin") == want  # the same file, another spelling
    assert verified.bytes_hashed() - before == 1000


def test_a_changed_file_is_hashed_again(tmp_path):
    f = tmp_path / "a.bin"
    _write(f, b"x" * 1000)
    verified.file_sha256(f)
    _write(f, b"y" * 1000, old=False)  # same size, rewritten in place: its mtime moves on
    assert verified.file_sha256(f) == hashlib.sha256(b"y" * 1000).hexdigest()


def test_a_file_changed_in_place_with_its_mtime_set_back_is_hashed_again(tmp_path):
    """Issue 27: 64 bytes written into a hashed file, its mtime put back with os.utime (what
    ``touch -r`` and ``cp --preserve`` do): the change time moved, so the hash is new."""
    f = tmp_path / "a.bin"
    _write(f, b"x" * 1000)
    st = os.stat(f)
    assert verified.file_sha256(f) == hashlib.sha256(b"x" * 1000).hexdigest()
    with open(f, "r+b") as fh:
        fh.write(b"z" * 64)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(f).st_size, os.stat(f).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    before = verified.bytes_hashed()
    assert verified.file_sha256(f) == hashlib.sha256(b"z" * 64 + b"x" * 936).hexdigest()
    assert verified.bytes_hashed() - before == 1000


def test_full_verification_hashes_a_remembered_file_again(tmp_path, monkeypatch):
    f = tmp_path / "a.bin"
    _write(f, b"x" * 1000)
    verified.file_sha256(f)
    monkeypatch.setenv(verified.VERIFY_ENV, "full")
    before = verified.bytes_hashed()
    verified.file_sha256(f)
    assert verified.bytes_hashed() - before == 1000


def test_a_racy_file_is_hashed_until_it_is_old_enough(tmp_path):
    f = tmp_path / "a.bin"
    _write(f, b"x" * 100, old=False)  # modified just now: its timestamp tick is still open
    before = verified.bytes_hashed()
    verified.file_sha256(f)
    verified.file_sha256(f)
    assert verified.bytes_hashed() - before == 200
    _age(f)
    verified.file_sha256(f)
    verified.file_sha256(f)
    assert verified.bytes_hashed() - before == 300


def test_an_unwritable_cache_hashes_every_time(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setattr(verified, "_db_path", lambda: blocked / verified.DB_NAME)
    f = tmp_path / "a.bin"
    _write(f, b"x" * 10)
    before = verified.bytes_hashed()
    assert verified.file_sha256(f) == hashlib.sha256(b"x" * 10).hexdigest()
    assert verified.file_sha256(f) == hashlib.sha256(b"x" * 10).hexdigest()
    assert verified.bytes_hashed() - before == 20


def _shards(root, n=3, *, age=True):
    torch.manual_seed(0)
    for s in range(n):
        samples = []
        for i in range(4):
            t = 5 + i
            samples.append({"id": f"s{s}-{i}", "input_ids": list(range(t)),
                            "loss_mask": [0] + [1] * (t - 1), "aux_hidden": torch.randn(t, 3 * H),
                            "final_hidden": torch.randn(t, H)})
        shard = root / f"shard-{s:05d}"
        write_shard(shard, samples, storage="final", aux_layers=[1, 2, 3], hidden_size=H)
        for f in shard.iterdir():
            if age:  # changed after extraction hashed it: a reader hashes it again
                _age(f, settle=False)
    if age:
        _settle()
    return sorted(root.iterdir())


def test_training_starts_on_unchanged_shards_without_reading_them_again(tmp_path):
    shards = _shards(tmp_path / "hidden")
    data_bytes = sum((s / DATA_NAME).stat().st_size for s in shards)
    before = verified.bytes_hashed()
    assert len(OfflineSource(tmp_path / "hidden")) == 12  # the first start verifies everything
    first = verified.bytes_hashed() - before
    assert first >= data_bytes
    before = verified.bytes_hashed()
    OfflineSource(tmp_path / "hidden")  # a retry / resume: nothing changed, nothing read
    assert verified.bytes_hashed() - before == 0


def test_a_shard_corrupted_after_verification_is_still_refused(tmp_path):
    shards = _shards(tmp_path / "hidden")
    assert len(list_shards(tmp_path / "hidden")) == 3
    data = shards[1] / DATA_NAME
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))  # same size, new mtime
    assert [s.name for s in list_shards(tmp_path / "hidden")] == ["shard-00000", "shard-00002"]


def test_the_first_training_start_after_extraction_hashes_nothing_extraction_verified(tmp_path):
    """Issue 27: extraction's manifests hash what they write; that hash is remembered against
    the file's stamp, so the first training start reads no byte to verify the shards."""
    shards = _shards(tmp_path / "hidden", age=False)
    before = verified.bytes_hashed()
    source = OfflineSource(tmp_path / "hidden")
    assert len(source) == 12 and len(source.shards) == len(shards)
    assert verified.bytes_hashed() - before == 0
    # ... and what changed after extraction is hashed (and refused when it differs)
    data = shards[2] / DATA_NAME
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    before = verified.bytes_hashed()
    assert [s.name for s in list_shards(tmp_path / "hidden")] == ["shard-00000", "shard-00001"]
    assert verified.bytes_hashed() - before == data.stat().st_size


def test_a_written_hash_whose_file_changed_before_it_was_remembered_is_not_kept(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 100)
    stamp = verified.stamp_of(f)
    f.write_bytes(b"y" * 100)
    assert not verified.remember_written(f, hashlib.sha256(b"x" * 100).hexdigest(), stamp)
    assert verified.file_sha256(f) == hashlib.sha256(b"y" * 100).hexdigest()

"""External shuffle: bucket routing, key order, bounded bucket count."""

from __future__ import annotations

from pathlib import Path

from eyas.prepare.shuffle import (
    MAX_BUCKETS,
    BucketWriter,
    bucket_count,
    bucket_of,
    iter_shuffled,
    shuffle_key,
)


def _route(folder: Path, k: int, sources: int = 3, per_source: int = 200) -> list[tuple[int, bytes]]:
    expected = []
    for s in range(sources):
        with BucketWriter(folder, s, k, buffer_bytes=4096) as w:
            for i in range(per_source):
                key, draw = shuffle_key(11, f"src{s}", i)
                payload = f"{s}:{i}\n".encode()
                split = int(draw < 0.1)
                w.add(key, i + 1, split, payload)
                expected.append((key, s, i + 1, split, payload))
    return [(split, payload) for _k, _s, _l, split, payload in sorted(expected)]


def test_records_come_back_in_key_order_whatever_the_bucket_count(tmp_path: Path) -> None:
    outputs = []
    for k in (1, 7, 64):
        folder = tmp_path / f"k{k}"
        folder.mkdir()
        expected = _route(folder, k)
        files = len(list(folder.iterdir()))
        assert 3 <= files <= 3 * k  # one file per (source, non-empty bucket)
        assert k != 7 or files == 21
        got = [(split, bytes(p)) for split, p in iter_shuffled(folder, k)]
        assert got == expected
        assert list(folder.iterdir()) == []  # buckets deleted once emitted
        outputs.append(got)
    assert outputs[0] == outputs[1] == outputs[2]


def test_duplicate_keys_are_ordered_by_source_then_line(tmp_path: Path) -> None:
    key = 123 << 40
    with BucketWriter(tmp_path, 1, 4) as w:
        w.add(key, 9, 0, b"s1-l9\n")
        w.add(key, 2, 0, b"s1-l2\n")
    with BucketWriter(tmp_path, 0, 4) as w:
        w.add(key, 5, 0, b"s0-l5\n")
    assert [bytes(p) for _, p in iter_shuffled(tmp_path, 4)] == [b"s0-l5\n", b"s1-l2\n", b"s1-l9\n"]


def test_bucket_of_splits_the_key_space_in_order() -> None:
    assert bucket_of(0, 10) == 0
    assert bucket_of(2**64 - 1, 10) == 9
    buckets = [bucket_of(key, 10) for key in sorted(shuffle_key(0, "d", i)[0] for i in range(500))]
    assert buckets == sorted(buckets)
    assert set(buckets) == set(range(10))


def test_bucket_count_keeps_a_bucket_within_a_quarter_of_the_budget() -> None:
    mb = 1 << 20
    assert bucket_count(10 * mb, 512) == 1
    assert bucket_count(1000 * mb, 512) == 8  # 128 MB per bucket
    assert bucket_count(1000 * mb, 16) == 250
    assert bucket_count(10**15, 16) == MAX_BUCKETS


def test_shuffle_key_depends_on_seed_source_and_id_only() -> None:
    assert shuffle_key(1, "a", "x") == shuffle_key(1, "a", "x")
    assert shuffle_key(1, "a", "x") != shuffle_key(2, "a", "x")
    assert shuffle_key(1, "a", "x") != shuffle_key(1, "b", "x")
    draws = [shuffle_key(3, "d", i)[1] for i in range(2000)]
    assert 0.05 < sum(d < 0.1 for d in draws) / len(draws) < 0.15

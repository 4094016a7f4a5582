"""External, seeded shuffle of byte records in bounded memory.

Each record gets a 64-bit key from a keyed hash of ``(seed, source name, sample id)``; the
shuffled order is simply "sorted by key" (ties, from duplicate ids, broken by source index
and line number). To sort more data than fits in memory:

- pass 1: every record is appended to one of K bucket files chosen by the top bits of its
  key (``bucket = key * K >> 64``), so bucket b holds exactly the keys of the b-th slice of
  the key space; each source writes its own bucket files, so sources can be routed by
  separate processes;
- pass 2: buckets are read one at a time, in order, sorted by key and emitted.

The output order therefore depends only on the seed and the records, never on K or on how
many processes routed them: a run with a tiny memory budget writes the same bytes as one
that fits in memory. Peak memory in pass 2 is about one bucket (total bytes / K).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from eyas import stopping

_HEADER = struct.Struct("<QHIBI")
"""Bucket record header: key, source index, line number, split flag, payload length."""

MAX_BUCKETS = 1000
"""Upper bound on K: each routing process holds one open file per bucket."""


def shuffle_key(seed: int, source: str, sample_id: str | int) -> tuple[int, float]:
    """``(key, draw)`` for one record: a 64-bit sort key and an independent uniform draw in [0, 1).

    Both depend only on the seed, the source (dataset) name and the sample id, so the
    position of a sample and its train/eval assignment are stable across runs and do not
    move when other datasets are added or removed.
    """
    digest = hashlib.blake2b(
        f"{seed}\x00{source}\x00{sample_id}".encode(), digest_size=16
    ).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little") / 2.0**64


def bucket_count(total_bytes: int, memory_budget_mb: int) -> int:
    """K such that one bucket holds at most a quarter of the memory budget (1 <= K <= MAX_BUCKETS).

    A quarter leaves room for the interpreter, the sort list and the I/O buffers, and makes
    buckets of similar size at any data size once K is more than a few, so the peak memory
    stays flat as the data grows.
    """
    per_bucket = max(1, memory_budget_mb * (1 << 20) // 4)
    return max(1, min(MAX_BUCKETS, math.ceil(total_bytes / per_bucket)))


def bucket_of(key: int, k: int) -> int:
    """The bucket of a key: the b-th of K equal slices of the 64-bit key space."""
    return (key * k) >> 64


class BucketWriter:
    """Route one source's records into K bucket files under `folder` (pass 1).

    Files are named ``b<bucket>.s<source>`` and opened on first use. `buffer_bytes` is
    the write buffer per open file; keep ``K * buffer_bytes`` inside the memory budget.
    """

    def __init__(self, folder: Path, source: int, k: int, buffer_bytes: int = 1 << 18) -> None:
        self.folder = Path(folder)
        self.source = source
        self.k = k
        self.buffer_bytes = buffer_bytes
        self._files: dict[int, object] = {}
        self.records = 0
        self.bytes = 0

    def add(self, key: int, line: int, split: int, payload: bytes) -> None:
        """Append one record; `split` is a small int carried to pass 2 (e.g. 0 train, 1 eval)."""
        b = bucket_of(key, self.k)
        fh = self._files.get(b)
        if fh is None:
            fh = open(self.folder / f"b{b:05d}.s{self.source:04d}", "ab", buffering=self.buffer_bytes)  # noqa: SIM115
            self._files[b] = fh
        fh.write(_HEADER.pack(key, self.source, line, split, len(payload)))
        fh.write(payload)
        self.records += 1
        self.bytes += len(payload)

    def close(self) -> None:
        """Flush and close every bucket file."""
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def __enter__(self) -> BucketWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_buckets(
    folder: Path, k: int, *, delete: bool = True
) -> Iterator[list[tuple[int, int, int, int, bytes]]]:
    """Yield each bucket's records, ``(key, source, line, split, payload)``, sorted (pass 2).

    Buckets come in order 0..K-1, so the concatenation is in global key order. With
    `delete`, a bucket's files are removed once it has been yielded and the caller has
    asked for the next, so temporary disk use shrinks as the output grows.
    """
    folder = Path(folder)
    by_bucket: dict[int, list[Path]] = {}
    for p in folder.iterdir():
        if p.name.startswith("b") and ".s" in p.name:
            by_bucket.setdefault(int(p.name[1:6]), []).append(p)
    unpack = _HEADER.unpack_from
    size = _HEADER.size
    for b in range(k):
        # A bucket is the merge's unit for a stop (SIGTERM, Ctrl-C: `eyas.stopping`): the
        # staging folder is abandoned, the previous output untouched, the rerun merges again.
        stopping.check(f"merge stopped at bucket {b + 1} of {k} (nothing written; the rerun "
                       "merges again)")
        files = sorted(by_bucket.get(b, []))
        entries = []
        for p in files:
            data = p.read_bytes()
            pos, end = 0, len(data)
            while pos < end:
                key, source, line, split, length = unpack(data, pos)
                pos += size
                entries.append((key, source, line, split, data[pos:pos + length]))
                pos += length
        entries.sort()
        yield entries
        if delete:
            for p in files:
                os.unlink(p)


def iter_shuffled(folder: Path, k: int, *, delete: bool = True) -> Iterator[tuple[int, bytes]]:
    """Yield ``(split, payload)`` of every routed record, in key order."""
    for entries in iter_buckets(folder, k, delete=delete):
        for _key, _source, _line, split, payload in entries:
            yield split, payload

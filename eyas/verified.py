"""Checksums remembered across runs: a file unchanged since it was hashed is not read again.

Every start, retry and resume of training verifies the hidden-state shards it reads; at the
users' scale (7.7–20 TB at ~0.74 GB/s) hashing them all costs hours with the GPUs idle.
`file_sha256` keeps each file's SHA-256 in a small SQLite table in the eyas cache
(``$EYAS_CACHE_DIR`` or ``~/.cache/eyas``, file ``verified-hashes.sqlite``), keyed by the
file's resolved path, device, inode, size and modification time (ns), and answers from it
while all of them are unchanged.

What a remembered hash trusts: that nothing rewrote the file in place while keeping its size
and modification time. Two guards keep that honest:

- *Racy files* (as git's index treats them): a file modified less than `RACY_S` seconds
  before it was hashed may change again within the same timestamp tick (file systems stamp
  with a coarse clock), so such an entry is never trusted; the file is hashed again until a
  hash is taken when it is old enough.
- *Full verification on demand*: ``EYAS_VERIFY=full`` in the environment (or
  ``full=True``) hashes every file again and refreshes the table — what to run after a disk
  error, or on a schedule against silent corruption.

A cache that cannot be opened or written (read-only home, a locked database) is skipped: the
file is hashed, never trusted blindly. Safe across processes (the ranks of one training run
look up the same table).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from eyas.io import sha256_file

VERIFY_ENV = "EYAS_VERIFY"
"""``full``: hash every file again, ignoring what was remembered."""
DB_NAME = "verified-hashes.sqlite"
RACY_S = 2.0
"""A file modified this close to (or after) the moment it was hashed is hashed again next time."""

_BYTES_HASHED = 0


def bytes_hashed() -> int:
    """Bytes this process has read to compute checksums through `file_sha256` (tests, logs)."""
    return _BYTES_HASHED


def full_verification() -> bool:
    """True when the environment asks for every file to be hashed again (``EYAS_VERIFY=full``)."""
    return os.environ.get(VERIFY_ENV, "").strip().lower() == "full"


def _db_path() -> Path:
    from eyas.tiny import cache_dir

    return cache_dir() / DB_NAME


def _open() -> sqlite3.Connection:
    con = sqlite3.connect(_db_path(), timeout=30)
    con.execute("CREATE TABLE IF NOT EXISTS hashes (path TEXT PRIMARY KEY, dev INTEGER, "
                "ino INTEGER, size INTEGER, mtime_ns INTEGER, hashed_at_ns INTEGER, "
                "sha256 TEXT)")
    return con


def _lookup(key: str) -> tuple | None:
    """The remembered row of `key`, or None (also when the table cannot be read)."""
    try:
        con = _open()
        try:
            return con.execute("SELECT dev, ino, size, mtime_ns, hashed_at_ns, sha256 FROM "
                               "hashes WHERE path = ?", (key,)).fetchone()
        finally:
            con.close()
    except (sqlite3.Error, OSError):
        return None


def _remember(row: tuple) -> None:
    """Store a hash; a table that cannot be written is skipped (nothing is remembered)."""
    try:
        con = _open()
        try:
            with con:
                con.execute("INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        finally:
            con.close()
    except (sqlite3.Error, OSError):
        pass


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def file_sha256(path: str | Path, *, full: bool | None = None) -> str:
    """SHA-256 of `path`: remembered when the file is unchanged since a trusted hash, else
    read and hashed (and remembered). `full` (default: ``EYAS_VERIFY=full``) always hashes.

    Raises OSError as reading the file would.
    """
    global _BYTES_HASHED
    full = full_verification() if full is None else full
    p = Path(path).resolve()
    st = os.stat(p)
    key = str(p)
    if not full:
        row = _lookup(key)
        if (row is not None and tuple(row[:4]) == _stamp(st)
                and row[3] + int(RACY_S * 1e9) < row[4]):
            return row[5]
    hashed_at = time.time_ns()
    digest = sha256_file(p)
    _BYTES_HASHED += st.st_size
    if _stamp(os.stat(p)) == _stamp(st):  # not changed while it was read
        _remember((key, *_stamp(st), hashed_at, digest))
    return digest

"""Checksums remembered across runs: a file unchanged since it was hashed is not read again.

Every start, retry and resume of training verifies the hidden-state shards it reads; at the
users' scale (7.7–20 TB at ~0.74 GB/s) hashing them all costs hours with the GPUs idle.
`file_sha256` keeps each file's SHA-256 in a small SQLite table in the eyas cache
(``$EYAS_CACHE_DIR`` or ``~/.cache/eyas``, file ``verified-hashes-v2.sqlite``), keyed by the
file's resolved path, device, inode, size, modification time and status-change time (ns),
and answers from it while all of them are unchanged. The change time is what a rewrite in
place cannot hide: ``os.utime`` (what ``touch -r`` and ``cp --preserve`` do) sets the
modification time back, but the kernel moves the change time on with every write and every
utime, and nothing sets it back.

A file a writer hashed itself (`remember_written`: the manifests of every phase, which hash
what they write) is remembered under the stamp it had then; a file found under another path
with the same device, inode, size and both times is the same file moved (a folder renamed
into place), so the first reader after the writer trusts its hash without reading it.

What a remembered hash trusts: that nothing rewrote the file without moving its change time.
Two guards keep that honest:

- *Racy files* (as git's index treats them): a file changed less than `RACY_S` seconds
  before a reader hashed it may change again within the same timestamp tick (file systems
  stamp with a coarse clock), so such an entry is never trusted; the file is hashed again
  until a hash is taken when it is old enough. A writer's own hash is exempt: until it
  publishes the file (renames it into place) no other process writes it.
- *Full verification on demand*: ``EYAS_VERIFY=full`` in the environment (or
  ``full=True``) hashes every file again and refreshes the table — what to run after a disk
  error, or on a schedule against silent corruption.

A cache that cannot be opened or written (read-only home, a locked database) is skipped: the
file is hashed, never trusted blindly. Safe across processes (the ranks of one training run
look up the same table) and threads (`eyas.extract.store.list_shards` verifies several shards
at once). One residue of the inode lookup: a file deleted and a new one of the same size
given its inode within the same timestamp tick would match the old file's row.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

from eyas.io import sha256_file

VERIFY_ENV = "EYAS_VERIFY"
"""``full``: hash every file again, ignoring what was remembered."""
DB_NAME = "verified-hashes-v2.sqlite"
"""v2: keyed on the change time too (a v1 table, without it, is left unread)."""
RACY_S = 2.0
"""A file modified this close to (or after) the moment it was hashed is hashed again next time."""

READ, WRITTEN = "read", "written"
"""How a remembered hash was taken: by a reader (`file_sha256`) or by the file's writer."""
HASH_THREADS = 8
"""Files hashed at once where many are verified (hashlib releases the GIL: one core each)."""

_BYTES_HASHED = 0
_COUNT_LOCK = threading.Lock()


def bytes_hashed() -> int:
    """Bytes this process has read to compute checksums through `file_sha256` (tests, logs)."""
    return _BYTES_HASHED


def full_verification() -> bool:
    """True when the environment asks for every file to be hashed again (``EYAS_VERIFY=full``)."""
    return os.environ.get(VERIFY_ENV, "").strip().lower() == "full"


def _db_path() -> Path:
    from eyas.layout import cache_dir

    return cache_dir() / DB_NAME


def _open() -> sqlite3.Connection:
    con = sqlite3.connect(_db_path(), timeout=30)
    con.execute("CREATE TABLE IF NOT EXISTS hashes (path TEXT PRIMARY KEY, dev INTEGER, "
                "ino INTEGER, size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, "
                "hashed_at_ns INTEGER, sha256 TEXT, origin TEXT)")
    con.execute("CREATE INDEX IF NOT EXISTS by_inode ON hashes (dev, ino)")
    return con


_COLUMNS = "dev, ino, size, mtime_ns, ctime_ns, hashed_at_ns, sha256, origin"


def _lookup(key: str, stamp: tuple[int, ...]) -> tuple | None:
    """The remembered row of `key`; else one of another path with the same device and inode
    whose stamp is `stamp` (the same file, moved: re-keyed to `key`); None when there is none
    (also when the table cannot be read)."""
    try:
        con = _open()
        try:
            row = con.execute(f"SELECT {_COLUMNS} FROM hashes WHERE path = ?",
                              (key,)).fetchone()
            if row is not None and tuple(row[:5]) == stamp:
                return row
            moved = con.execute(f"SELECT path, {_COLUMNS} FROM hashes WHERE dev = ? AND "
                                "ino = ? AND size = ? AND mtime_ns = ? AND ctime_ns = ?",
                                stamp).fetchone()
            if moved is None:
                return row
            with con:
                con.execute("DELETE FROM hashes WHERE path = ?", (moved[0],))
                con.execute("INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (key, *moved[1:]))
            return moved[1:]
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
                con.execute("INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            row)
        finally:
            con.close()
    except (sqlite3.Error, OSError):
        pass


def _stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _trusted(row: tuple | None, stamp: tuple[int, ...]) -> bool:
    if row is None or tuple(row[:5]) != stamp:
        return False
    if row[7] == WRITTEN:
        return True
    return max(row[3], row[4]) + int(RACY_S * 1e9) < row[5]


def stamp_of(path: str | Path) -> tuple[int, int, int, int, int]:
    """What a remembered hash is keyed on: (device, inode, size, mtime ns, ctime ns)."""
    return _stamp(os.stat(path))


def remember_written(path: str | Path, sha256: str, stamp: tuple[int, ...]) -> bool:
    """Remember `sha256`, the hash the writer of `path` took of what it wrote, when the file
    still has the `stamp` (`stamp_of`) it had before that hash was taken -- nothing changed it
    since. Returns whether it was remembered (not when the stamp moved, or the table cannot
    be written: then a reader hashes the file)."""
    p = Path(path).resolve()
    if stamp_of(p) != tuple(stamp):
        return False
    _remember((str(p), *stamp, time.time_ns(), sha256, WRITTEN))
    return True


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
        row = _lookup(key, _stamp(st))
        if _trusted(row, _stamp(st)):
            return row[6]
    hashed_at = time.time_ns()
    digest = sha256_file(p)
    with _COUNT_LOCK:
        _BYTES_HASHED += st.st_size
    if _stamp(os.stat(p)) == _stamp(st):  # not changed while it was read
        _remember((key, *_stamp(st), hashed_at, digest, READ))
    return digest

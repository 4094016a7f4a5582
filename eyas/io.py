"""Atomic, checksummed file I/O shared by every phase.

Rules every writer in eyas follows:
- a file a reader can see is complete: write to a temporary name in the same folder,
  fsync, then ``os.replace`` onto the final name; the temporary name carries this machine's
  name and the writer's pid, so the next writer of that file removes what a killed one left;
- JSONL readers report the file and 1-based line number of any bad record.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from eyas.errors import DataError
from eyas.proc import pid_alive

TMP_PREFIX = ".tmp-"
_HOST = socket.gethostname().replace(".", "_")[:40] or "host"


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file beside `path` (``.tmp-<name>.<host>-<pid>.<random>``), after
    removing the ones of earlier writers of `path` on this machine whose process is gone
    (a writer killed with SIGKILL cannot remove its own; the run's lock keeps two runs from
    writing one path, so a dead writer's temp file is never going to be renamed)."""
    mine = f"{TMP_PREFIX}{path.name}.{_HOST}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            if not entry.name.startswith(mine):
                continue
            pid = entry.name[len(mine):].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(entry.path)
    return tempfile.mkstemp(prefix=f"{mine}{os.getpid()}.", dir=path.parent)


@contextlib.contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside `path`; on clean exit fsync it and rename it onto `path`.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def locked(lock_path: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` (created if missing) for the block, waiting for
    another holder; `on_wait` is called once first when it must wait. The kernel releases the
    lock however the holder ends."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json(path: str | Path, obj: Any) -> None:
    """Write `obj` as indented, key-sorted JSON, atomically."""
    with atomic_write(path) as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")


def read_json(path: str | Path) -> Any:
    """Read a JSON file; a parse error names the file and line."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("file not found", path=path) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON ({exc.msg}, column {exc.colno})", path=path, line=exc.lineno) from None


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file.

    Raises DataError naming the file and line for a line that is not a JSON object.
    An empty or missing file is an error too: a dataset that silently contributes
    nothing is the failure users fear most.
    """
    path = Path(path)
    if not path.exists():
        raise DataError("file not found", path=path)
    if path.stat().st_size == 0:
        raise DataError("file is empty (expected one JSON object per line)", path=path)
    for lineno, item in iter_jsonl_items(path):
        if isinstance(item, DataError):
            raise item
        yield lineno, item


def iter_jsonl_items(path: str | Path) -> Iterator[tuple[int, dict | DataError]]:
    """Like `iter_jsonl`, but a bad line is yielded as its DataError and reading goes on
    (for callers that reject bad records instead of stopping). A ``.gz`` file is read through
    gzip (HumanEval ships as ``HumanEval.jsonl.gz``)."""
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield lineno, DataError(f"malformed JSON: {exc}", path=path, line=lineno)
                continue
            if not isinstance(obj, dict):
                yield lineno, DataError(
                    f"expected a JSON object, got {type(obj).__name__}", path=path, line=lineno
                )
                continue
            yield lineno, obj


def dumps_line(obj: Any) -> bytes:
    """One JSONL line (bytes, newline-terminated)."""
    return orjson.dumps(obj) + b"\n"


class AtomicJsonlWriter:
    """Write a JSONL file atomically: lines go to a temp file, `commit()` renames it.

    Use as a context manager; leaving the block without an exception commits, an
    exception discards the temp file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = _temp_beside(self.path)
        self._fh = os.fdopen(fd, "wb", buffering=1 << 20)
        self.count = 0

    def write(self, obj: Any) -> None:
        self._fh.write(dumps_line(obj))
        self.count += 1

    def write_raw(self, line: bytes) -> None:
        """Write an already-serialised line (must end with a newline)."""
        self._fh.write(line)
        self.count += 1

    def commit(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.path)
        _fsync_dir(self.path.parent)

    def abort(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)

    def __enter__(self) -> AtomicJsonlWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def replace_dir(src: Path, dst: Path) -> None:
    """Rename folder `src` onto `dst` (same volume): an existing `dst` is moved aside first
    (``.old-<name>-<pid>-<hex>``) and deleted after, so `dst` is never half-written."""
    old = None
    if dst.exists():
        old = dst.parent / f".old-{dst.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(dst, old)
    os.rename(src, dst)
    _fsync_dir(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

"""Check 2, disk: free space on the data volume against the extraction plan
(`eyas.extract.run.disk_estimate`), and the volume's sequential write and read bandwidth on a
bounded temporary file, against what training will read per second (bytes per token of the
configured storage x the training tokens/s that check 5 measures: `relate_bandwidth`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from eyas.disk import human_bytes
from eyas.extract.config import ExtractConfig
from eyas.extract.plan import bytes_per_token, free_bytes
from eyas.extract.run import disk_estimate
from eyas.preflight.result import CheckFailed, CheckResult

NAME = "disk"
BLOCK = 4 << 20


def bandwidth(folder: Path, size_bytes: int) -> tuple[float, float]:
    """(write, read) bytes/s of a sequential pass over a temporary file of `size_bytes` in
    `folder`: written in 4 MiB blocks and fsynced, dropped from the page cache, read back.

    The file has no name (`_unnamed_file`), so nothing is left in `folder` whatever ends the
    process: a stop, which may end it while this runs in a check's thread, or SIGKILL."""
    folder.mkdir(parents=True, exist_ok=True)
    block = os.urandom(min(BLOCK, size_bytes))
    fd = _unnamed_file(folder)
    try:
        t0 = time.perf_counter()
        left = size_bytes
        while left > 0:
            left -= os.write(fd, block[:left])
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        if hasattr(os, "posix_fadvise"):  # read the disk, not the page cache
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        offset = 0
        while chunk := os.pread(fd, BLOCK, offset):
            offset += len(chunk)
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
    return size_bytes / max(write_s, 1e-9), size_bytes / max(read_s, 1e-9)


def _unnamed_file(folder: Path) -> int:
    """A read-write file on `folder`'s volume that no folder lists: ``O_TMPFILE`` where the file
    system has it, else a file removed the moment it is created (its blocks are freed when the
    descriptor closes, or the process dies)."""
    if hasattr(os, "O_TMPFILE"):
        try:
            return os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
        except OSError:  # a file system without it (EOPNOTSUPP, EISDIR on old kernels)
            pass
    path = folder / f".eyas-preflight-disk-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.unlink(path)
    return fd


def check_disk(*, data_dir: Path, cfg: ExtractConfig, records: int, tokens: int,
               hidden_size: int, probe_bytes: int, reserve_bytes: int = 0,
               free: int | None = None) -> CheckResult:
    """Check 2 on `data_dir` (where ``hidden/`` goes) for `records` samples of `tokens` tokens
    of a target of `hidden_size`; `free` overrides the measured free bytes (tests)."""
    est = disk_estimate(cfg, records=records, tokens=tokens, hidden_size=hidden_size)
    need = est["required_bytes"] + reserve_bytes
    free = free_bytes(data_dir) if free is None else free
    data: dict[str, Any] = {"required_bytes": need, "free_bytes": free,
                            "bytes_per_token": bytes_per_token(hidden_size, cfg.storage,
                                                               dtype=cfg.dtype, topk=cfg.topk)}
    figure = f"{human_bytes(free)} free / {human_bytes(need)} needed"
    if free < need:
        raise CheckFailed(
            f"{data_dir}: {human_bytes(free)} free, the extraction of {records:,} samples "
            f"({tokens:,} tokens, storage {cfg.storage!r}) needs {human_bytes(est['estimated_bytes'])}"
            f" + {cfg.disk_margin:.0%} margin (extract.disk_margin)"
            + (f" + {human_bytes(reserve_bytes)} reserve (preflight.reserve_bytes)" if reserve_bytes else ""),
            fix="free space on that volume (`eyas clean` old hidden/ folders), point the run "
                "at a larger volume, or choose extract.storage 'compact' (the smallest)",
            figure=figure, data=data)
    write_bps, read_bps = bandwidth(data_dir, probe_bytes)
    data.update(write_bps=write_bps, read_bps=read_bps)
    return CheckResult(NAME, True,
                       f"{data_dir}: {human_bytes(free)} free for {human_bytes(need)} "
                       f"(plan: {records:,} samples, {tokens:,} tokens, storage {cfg.storage!r}); "
                       f"sequential write {write_bps / 1e6:,.0f} MB/s, read {read_bps / 1e6:,.0f} "
                       f"MB/s on {human_bytes(probe_bytes)}",
                       figure=figure, data=data)


def relate_bandwidth(result: CheckResult, train_tok_s: float | None) -> CheckResult:
    """Judge the measured read bandwidth against what training will read: bytes per token x
    the training tokens/s (all processes); a disk slower than that starves the GPUs."""
    if not result.ok or "read_bps" not in result.data:
        return result
    if not train_tok_s:
        result.partial = "training speed unknown: the read bandwidth is not judged against it"
        return result
    need = result.data["bytes_per_token"] * train_tok_s
    result.data["training_read_bps"] = need
    result.detail += (f"; training reads {need / 1e6:,.1f} MB/s ({result.data['bytes_per_token']:,} "
                      f"bytes/token x {train_tok_s:,.0f} tokens/s)")
    if result.data["read_bps"] < need:
        result.ok = False
        result.fix = ("the data volume reads slower than training consumes: put hidden/ on a "
                      "faster (local NVMe) volume, or choose extract.storage 'compact' (fewer "
                      "bytes per token)")
    return result

"""Phase 3: merge the tokenized datasets into one shuffled train set and an eval set.

Contract of `merge_datasets`:

- **Selection.** ``cfg.include`` (default: every input) minus ``cfg.exclude``. Outliers are
  flagged in ``stats.json`` (`eyas.prepare.outliers`) but never dropped unless the config says so.
- **Validation while streaming.** Each non-blank line must be a JSON object with
  ``input_ids`` (non-negative integers) and ``loss_mask`` (0/1) of equal, non-zero length,
  and an optional ``id`` (string or integer; default ``<dataset>-<line>``). Anything else
  raises `DataError` naming the file, the 1-based line and the field. Other fields are
  accepted and not carried over; a ``dataset`` field is replaced by the dataset's name.
- **Truncation.** A sample longer than ``cfg.max_seq_len`` keeps its first ``max_seq_len``
  tokens; ``input_ids`` and ``loss_mask`` are cut at the same position, so the mask is
  recomputed by construction: positions past the cut vanish and every kept position keeps
  its own value. In particular the last kept token stays supervised when it was: the mask
  marks tokens to be predicted, that token is still present, and the shift to next-token
  targets is the training code's job (SpecForge's convention). A sample left with no
  supervised token (before or after the cut) is dropped and counted.
- **Shuffle and split.** Order and split are functions of ``(seed, dataset, id)`` only
  (`eyas.prepare.shuffle.shuffle_key`): a sample goes to eval when its draw is below
  ``cfg.eval_fraction``. Same inputs + same config give byte-identical files, whatever the
  memory budget (bucket count) or the number of worker processes.
- **Outputs** in `out_dir`: ``train.jsonl`` and ``eval.jsonl`` (one
  ``{"id", "input_ids", "loss_mask", "dataset"}`` per line; SpecForge reads ``input_ids`` and
  ``loss_mask`` and ignores the rest), ``stats.json`` and ``manifest.json`` (written last).
- **Atomicity.** Everything is built in a staging folder beside `out_dir` (same filesystem)
  and swapped in at the end (one ``renameat2(RENAME_EXCHANGE)`` on Linux, else two renames).
  An interrupted merge leaves the previous `out_dir` untouched and nothing that looks
  complete; staging folders of dead processes are removed by the next run. `out_dir`
  belongs to the merge: a file in it that the merge does not write stops the merge
  (nothing is deleted that the merge did not make).
- **Bounded memory.** Records are never all in memory. Pass 1 streams each file once
  (validating, hashing, counting; `eyas.prepare.merge_scan`) and routes a 32-byte index entry per
  record (offset, length, render kind) into K bucket files by its shuffle key. Pass 2 takes
  one bucket at a time: reads its lines back from the inputs (``pread``, in file order),
  writes them in key order (`eyas.prepare.shuffle`). K is chosen so that one bucket's lines fill at
  most a quarter of ``cfg.memory_budget_mb``; the index itself costs ~32 bytes per record on
  disk, not in memory. Unchanged lines are written as the input's own bytes with the
  dataset spliced in; only truncated or unusual lines are rebuilt. Pass 1 runs one process
  per input file (up to `workers`); excluded files are profiled while pass 2 writes.
- **Not checked:** duplicate ids within a dataset (phase 2's contract). Duplicates keep
  a deterministic order (ties broken by dataset and line) and share one eval/train draw.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import os
import re
import secrets
import shutil
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from eyas.errors import ConfigError, DataError, EyasError
from eyas.io import write_json
from eyas.layout import SPLITS
from eyas.manifest import MANIFEST_NAME, write_manifest
from eyas.prepare.config import MergeConfig
from eyas.prepare.merge_scan import INDEX, ScanResult, ScanTask, render, scan_file
from eyas.prepare.outliers import DatasetProfile, Outlier, find_outliers, selected_datasets
from eyas.prepare.shuffle import bucket_count, iter_buckets
from eyas.proc import exit_with_parent, pid_alive

__all__ = [
    "DatasetProfile",
    "Outlier",
    "dataset_profile",
    "find_outliers",
    "merge_datasets",
    "OUTPUT_FILES",
]

log = logging.getLogger(__name__)

OUTPUT_FILES = ("train.jsonl", "eval.jsonl", "stats.json", MANIFEST_NAME)
"""Everything `merge_datasets` writes into `out_dir`."""

_STAGE_PREFIX = ".tmp-merge-"


def _raise(error: dict) -> None:
    raise DataError(error["error"], path=error["path"], line=error["line"], field=error["field"])


def dataset_profile(path: Path) -> DatasetProfile:
    """Scan one ``tokenized_data.jsonl``: samples, tokens, supervised tokens, mean/max length.

    Validates every line like the merge does (raises `DataError` with file, line and
    field) but never converts the token arrays to Python objects, so it runs at
    hundreds of MB/s.
    """
    result = scan_file(ScanTask(index=0, name=Path(path).parent.name, path=str(path), route=False))
    if result.error:
        _raise(result.error)
    assert result.profile is not None
    return result.profile


# --------------------------------------------------------------------------- staging


def _remove_stale_stages(out_dir: Path) -> None:
    """Remove staging folders of earlier merges into `out_dir` whose process is gone."""
    pattern = re.compile(re.escape(_STAGE_PREFIX + out_dir.name) + r"-(?:old-)?(\d+)-[0-9a-f]+")
    if not out_dir.parent.is_dir():
        return
    for entry in sorted(out_dir.parent.iterdir()):
        match = pattern.fullmatch(entry.name)
        if match and entry.is_dir() and not pid_alive(int(match.group(1))):
            log.info("removing %s, left by an interrupted merge", entry)
            shutil.rmtree(entry, ignore_errors=True)


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise EyasError(f"{out_dir}: exists and is not a folder (expected the merge output folder)")
    if out_dir.is_dir():
        foreign = sorted(p.name for p in out_dir.iterdir()
                         if p.name not in OUTPUT_FILES and not p.name.startswith(".tmp-"))
        if foreign:
            raise EyasError(
                f"{out_dir}: holds {foreign}, which the merge did not write; the merge replaces "
                "this whole folder, so move them elsewhere first"
            )


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False when unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _publish(stage: Path, out_dir: Path) -> None:
    """Put the finished `stage` folder at `out_dir`, replacing a previous output."""
    _check_out_dir(out_dir)
    if not out_dir.exists():
        os.rename(stage, out_dir)
        return
    if _exchange(stage, out_dir):
        shutil.rmtree(stage)  # now holds the previous output
        return
    old = out_dir.parent / f"{_STAGE_PREFIX}{out_dir.name}-old-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(out_dir, old)
    os.rename(stage, out_dir)
    shutil.rmtree(old)


# --------------------------------------------------------------------------- the merge


PROCESS_MIN_BYTES = 16 << 20
"""Inputs below this many bytes in all are scanned in this process: starting a worker process
takes about what scanning 16 MB does (~0.2 CPU-s each, measured on 2 cores)."""


def _default_workers(tasks: int, total_bytes: int) -> int:
    if total_bytes < PROCESS_MIN_BYTES:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(cores, tasks))


class _Scans:
    """Pass-1 scans, in worker processes when ``workers > 1``.

    Routed (selected) files are submitted first, largest first; the profile-only scans of
    excluded files follow and may still run while pass 2 writes, since only the report
    needs them. The first DataError of a routed file is raised; an excluded file's error
    is kept in its result.
    """

    def __init__(self, tasks: list[ScanTask], workers: int) -> None:
        def order(t: ScanTask) -> tuple[int, int]:
            return (-(os.path.getsize(t.path) if os.path.exists(t.path) else 0), t.index)

        self.routed = sorted((t for t in tasks if t.route), key=order)
        self.others = sorted((t for t in tasks if not t.route), key=order)
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.futures: dict = {}
        self.results: dict[str, ScanResult] = {}

    def __enter__(self) -> _Scans:
        if self.workers > 1:
            self.pool = ProcessPoolExecutor(max_workers=self.workers,
                                            mp_context=get_context("spawn"),
                                            initializer=exit_with_parent,
                                            initargs=(os.getpid(),))
            for task in self.routed + self.others:
                self.futures[self.pool.submit(scan_file, task)] = task
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=exc_type is not None)

    def _take(self, result: ScanResult, task: ScanTask) -> None:
        if result.error and task.route:
            _raise(result.error)
        self.results[task.name] = result

    def _collect(self, tasks: list[ScanTask]) -> dict[str, ScanResult]:
        if self.pool is None:
            for task in tasks:
                self._take(scan_file(task), task)
        else:
            wanted = set(id(t) for t in tasks)
            pending = {f for f, t in self.futures.items() if id(t) in wanted}
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in sorted(done, key=lambda f: self.futures[f].index):
                    self._take(fut.result(), self.futures[fut])
        return dict(self.results)

    def routed_results(self) -> dict[str, ScanResult]:
        """Wait for every selected file's scan (its records are then all routed)."""
        return self._collect(self.routed)

    def all_results(self) -> dict[str, ScanResult]:
        """Wait for the excluded files' profiles too."""
        return self._collect(self.others)


def merge_datasets(
    inputs: dict[str, Path],
    out_dir: Path,
    cfg: MergeConfig,
    *,
    workers: int | None = None,
    buckets: int | None = None,
) -> dict:
    """Merge, truncate, shuffle and split the selected datasets into `out_dir` (see module doc).

    `inputs` maps every prepared dataset name, in registry order, to its
    ``tokenized_data.jsonl``; excluded ones are still scanned for the outlier report (a
    broken excluded file is reported, not fatal). `workers` caps the pass-1 processes
    (default: one per input, at most the usable cores; one, this process, below
    `PROCESS_MIN_BYTES` of input); `buckets` overrides the bucket count
    derived from ``cfg.memory_budget_mb`` (tests, tuning) and never changes the output.

    Returns the statistics also written to ``stats.json``. Raises `ConfigError` for an
    include/exclude name that is not an input or an empty selection, `DataError` for a bad
    or missing selected input (file, line, field), `EyasError` when `out_dir` holds files
    the merge did not write. On any error `out_dir` is left as it was.
    """
    out_dir = Path(out_dir)
    names = list(inputs)
    for setting, listed in (("include", cfg.include or []), ("exclude", cfg.exclude)):
        unknown = [n for n in listed if n not in inputs]
        if unknown:
            raise ConfigError(f"unknown dataset(s) {unknown}; known: {names}",
                              where=f"merge.{setting}")
    selected = selected_datasets(names, cfg)
    if not selected:
        raise ConfigError(f"selects no dataset (include={cfg.include}, exclude={cfg.exclude})",
                          where="merge")
    _check_out_dir(out_dir)
    for name in selected:
        path = Path(inputs[name])
        if not path.is_file():
            raise DataError(f"file not found (expected the tokenized dataset {name!r})", path=path)
    _remove_stale_stages(out_dir)

    stamps = {n: (st.st_size, st.st_mtime_ns)
              for n in selected for st in [Path(inputs[n]).stat()]}
    total_bytes = sum(size for size, _ in stamps.values())
    k = buckets or bucket_count(total_bytes, cfg.memory_budget_mb)
    budget = cfg.memory_budget_mb << 20
    buffer_bytes = max(1 << 12, min(1 << 16, budget // (8 * k)))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = out_dir.parent / f"{_STAGE_PREFIX}{out_dir.name}-{os.getpid()}-{secrets.token_hex(4)}"
    bucket_dir = stage / "buckets"
    bucket_dir.mkdir(parents=True)
    try:
        tasks = [
            ScanTask(index=i, name=n, path=str(inputs[n]), route=n in selected,
                  bucket_dir=str(bucket_dir), buckets=k, buffer_bytes=buffer_bytes,
                  seed=cfg.seed, eval_fraction=cfg.eval_fraction, max_seq_len=cfg.max_seq_len)
            for i, n in enumerate(names)
        ]
        nproc = workers if workers is not None else _default_workers(len(tasks), total_bytes)
        log.info("merge: %d of %d datasets, %.1f MB, %d bucket(s), %d process(es)",
                 len(selected), len(names), total_bytes / 1e6, k, nproc)
        files = {s: stage / f"{s}.jsonl" for s in SPLITS}
        with _Scans(tasks, nproc) as scans:
            scans.routed_results()
            hashes = _write_shuffled(bucket_dir, k, {i: (n, Path(inputs[n])) for i, n in
                                                     enumerate(names) if n in selected},
                                     files, cfg.max_seq_len)
            results = scans.all_results()
        bucket_dir.rmdir()
        known: dict[str, str] = {str(inputs[n]): r.sha256 for n, r in results.items() if r.sha256}
        for s in SPLITS:
            known[str(files[s])] = hashes[s]
        for name in selected:  # pass 2 read the inputs again: they must not have changed
            st = Path(inputs[name]).stat()
            if (st.st_size, st.st_mtime_ns) != stamps[name]:
                raise DataError("changed while the merge was running (re-run the merge)",
                                path=inputs[name])

        stats = _stats(inputs, selected, results, cfg)
        write_json(stage / "stats.json", stats)
        write_manifest(
            stage, phase="merge", inputs={n: inputs[n] for n in names},
            outputs=["train.jsonl", "eval.jsonl", "stats.json"],
            config=cfg.model_dump(mode="json"),
            counts={key: stats[key] for key in ("records", "tokens", "supervised_tokens",
                                                "truncated", "dropped_unsupervised")}
            | {"train_records": stats["train"]["records"],
               "eval_records": stats["eval"]["records"]},
            known_sha256=known,
        )
        _publish(stage, out_dir)
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(out_dir.parent).free
            raise EyasError(
                f"no space left on the device of {out_dir} while merging ({exc.strerror}; "
                f"{free / 1e9:,.2f} GB free there now, the staging folder deleted). The merge "
                f"writes about as much as its selected inputs hold ({total_bytes / 1e9:,.2f} "
                f"GB), plus a small bucket index: free space there, then run again") from None
        raise
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stats


def _write_shuffled(bucket_dir: Path, k: int, sources: dict[int, tuple[str, Path]],
                    files: dict[str, Path], max_seq_len: int) -> dict[str, str]:
    """Pass 2: read each bucket's lines back from the inputs, write them in key order.

    Within a bucket the lines are read in file order (one ``pread`` each), then rendered
    and written in key order (one ``writev`` each, no copy into a user-space buffer);
    only one bucket's lines are in memory at a time. Returns the SHA-256 of each output.
    """
    hashers = [hashlib.sha256() for _ in SPLITS]
    fds = {i: os.open(path, os.O_RDONLY) for i, (_name, path) in sources.items()}
    outs = [os.open(files[s], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for s in SPLITS]
    try:
        for entries in iter_buckets(bucket_dir, k):
            where = [INDEX.unpack(e[4]) for e in entries]
            lines: list[bytes] = [b""] * len(entries)
            for i in sorted(range(len(entries)), key=lambda i: (entries[i][1], where[i][0])):
                offset, length, _kind = where[i]
                lines[i] = os.pread(fds[entries[i][1]], length, offset)
            for (_key, source, lineno, split, _p), (_o, _l, kind), line in zip(
                    entries, where, lines, strict=True):
                name, path = sources[source]
                pieces = render(line, kind, dataset=name, lineno=lineno,
                                max_seq_len=max_seq_len, path=path)
                hasher = hashers[split]
                for piece in pieces:
                    hasher.update(piece)
                _writev_all(outs[split], pieces)
            del lines
        for fd in outs:
            os.fsync(fd)
    finally:
        for fd in [*fds.values(), *outs]:
            os.close(fd)
    return {s: h.hexdigest() for s, h in zip(SPLITS, hashers, strict=True)}


def _writev_all(fd: int, pieces: list) -> None:
    """Write every piece, retrying after a short write."""
    total = sum(len(p) for p in pieces)
    written = os.writev(fd, pieces)
    if written < total:  # rare for regular files; finish byte by byte of what is left
        rest = b"".join(bytes(p) for p in pieces)[written:]
        while rest:
            rest = rest[os.write(fd, rest):]


def _stats(inputs: dict[str, Path], selected: list[str], results: dict[str, ScanResult],
           cfg: MergeConfig) -> dict:
    """The content of ``stats.json``: deterministic (no timings, no bucket count)."""
    profiles = {n: results[n].profile for n in inputs if results[n].profile is not None}
    outliers = find_outliers(profiles, cfg)
    per: dict[str, dict] = {}
    totals = {s: {"records": 0, "tokens": 0, "supervised_tokens": 0} for s in SPLITS}
    for name in inputs:
        r = results[name]
        entry: dict[str, Any] = {
            "selected": name in selected,
            "before": r.profile.to_dict() if r.profile else None,
        }
        if r.error:
            entry["scan_error"] = r.error
        if name in selected:
            after = {key: r.out["train"][key] + r.out["eval"][key]
                     for key in ("records", "tokens", "supervised_tokens")}
            entry["after"] = after | {"train": r.out["train"]["records"],
                                      "eval": r.out["eval"]["records"]}
            entry["truncated"] = r.truncated
            entry["dropped_unsupervised"] = r.dropped_unsupervised
            entry["dropped_after_truncation"] = r.dropped_after_truncation
            for s in SPLITS:
                for key in totals[s]:
                    totals[s][key] += r.out[s][key]
        per[name] = entry
    excluded = {
        n: ("exclude" if n in cfg.exclude else "not in include") for n in inputs if n not in selected
    }
    return {
        "records": totals["train"]["records"] + totals["eval"]["records"],
        "tokens": totals["train"]["tokens"] + totals["eval"]["tokens"],
        "supervised_tokens": (totals["train"]["supervised_tokens"]
                              + totals["eval"]["supervised_tokens"]),
        "train": totals["train"],
        "eval": totals["eval"],
        "selected": selected,
        "excluded": excluded,
        "outliers": [o.to_dict() for o in outliers],
        "truncated": sum(results[n].truncated for n in selected),
        "dropped_unsupervised": sum(results[n].dropped_unsupervised for n in selected),
        "dropped_after_truncation": sum(results[n].dropped_after_truncation for n in selected),
        "max_seq_len": cfg.max_seq_len,
        "seed": cfg.seed,
        "eval_fraction": cfg.eval_fraction,
        "datasets": per,
    }

"""Shards of the merged data: a deterministic split, and the extraction of one shard.

``plan_shards`` cuts a merged JSONL file into consecutive groups of ``shard_size`` records
(file order; merge already shuffled it), so the same input and config always give the same
shards. ``extract_shard`` does one shard: it skips a shard whose manifest verifies and was
made from the same records, target and settings, and otherwise (missing, interrupted,
corrupted, stale) extracts it again and writes it atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from eyas import stopping
from eyas.errors import ConfigError, DataError
from eyas.extract.config import ExtractConfig
from eyas.extract.hf_backend import BatchResult, HFBackend
from eyas.extract.store import (
    DATA_NAME,
    list_shards,
    read_shard_manifest,
    remove_dead_writers,
    shard_name,
    verify_shard,
    write_shard,
)
from eyas.extract.target import resolve_aux_layers, target_fingerprint
from eyas.io import iter_jsonl
from eyas.manifest import read_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardSpec:
    """One shard to extract: records ``[start, stop)`` (0-based record ordinals) of a file.

    JSON-able and hashable, so an orchestrator can pass it to a task and key a cache on it.
    `content_hash` covers the shard's records: each one's sample id, token ids and loss mask
    (`record_digest_line`), in file order.
    """

    index: int
    merged_file: str
    start: int
    stop: int
    num_samples: int
    num_tokens: int
    content_hash: str

    @property
    def name(self) -> str:
        return shard_name(self.index)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_record(path: Path, lineno: int, obj: dict) -> tuple[str, int]:
    ids, mask = obj.get("input_ids"), obj.get("loss_mask")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise DataError("expected a non-empty list of token ids", path=path, line=lineno,
                        field="input_ids")
    if not isinstance(mask, list) or len(mask) != len(ids):
        raise DataError(f"expected a list of {len(ids)} 0/1 values (one per token)", path=path,
                        line=lineno, field="loss_mask")
    if "id" not in obj:
        raise DataError("missing sample id", path=path, line=lineno, field="id")
    return str(obj["id"]), len(ids)


def record_digest_line(sid: str, input_ids: list, loss_mask: list) -> bytes:
    """What one record adds to its shard's `content_hash`: its id, token ids and loss mask
    (the arrays as compact JSON), so a merge that changes any of them -- same length or not --
    makes the shard stale. ``eyas/remote/_probe_script.py`` (`record_digest_line`) computes
    the same bytes from a record's text."""
    return b"\t".join([sid.encode(), orjson.dumps(input_ids), orjson.dumps(loss_mask)]) + b"\n"


def plan_shards(merged_file: Path, cfg: ExtractConfig) -> list[ShardSpec]:
    """Split `merged_file` into shards of ``cfg.shard_size`` records (the last may be smaller).

    Streams the file once; raises DataError (file, line, field) on a malformed record.
    """
    merged_file = Path(merged_file)
    specs: list[ShardSpec] = []
    start, tokens, h = 0, 0, hashlib.sha256()
    count = 0
    for lineno, obj in iter_jsonl(merged_file):
        sid, n = _check_record(merged_file, lineno, obj)
        h.update(record_digest_line(sid, obj["input_ids"], obj["loss_mask"]))
        tokens += n
        count += 1
        if count - start == cfg.shard_size:
            specs.append(ShardSpec(len(specs), str(merged_file), start, count, count - start,
                                   tokens, h.hexdigest()[:16]))
            start, tokens, h = count, 0, hashlib.sha256()
    if count > start:
        specs.append(ShardSpec(len(specs), str(merged_file), start, count, count - start, tokens,
                               h.hexdigest()[:16]))
    return specs


def read_records(spec: ShardSpec) -> list[dict[str, Any]]:
    """The records of one shard (``id``, ``input_ids``, ``loss_mask``), streamed from its file."""
    path = Path(spec.merged_file)
    out = []
    for ordinal, (lineno, obj) in enumerate(iter_jsonl(path)):
        if ordinal >= spec.stop:
            break
        if ordinal >= spec.start:
            sid, _ = _check_record(path, lineno, obj)
            out.append({"id": sid, "input_ids": obj["input_ids"], "loss_mask": obj["loss_mask"]})
    return out


def storage_settings(cfg: ExtractConfig) -> dict:
    """The part of `shard_settings` the extraction config alone decides (storage, topk,
    dtype), as recorded in a shard's manifest."""
    return {
        "storage": cfg.storage,
        "topk": cfg.topk if cfg.storage in ("topk", "compact") else None,
        "dtype": "float8_e4m3fn" if cfg.storage == "compact" else cfg.dtype,
        # Only when set: shards made before compute_dtype existed keep their settings.
        **({"compute_dtype": cfg.compute_dtype} if cfg.compute_dtype != "auto" else {}),
    }


def shard_settings(spec: ShardSpec, cfg: ExtractConfig, aux_layers: list[int], fingerprint: str) -> dict:
    """What a shard's content depends on; a verified shard with other settings is stale."""
    return {
        "content_hash": spec.content_hash,
        "target_fingerprint": fingerprint,
        "aux_layers": aux_layers,
        **storage_settings(cfg),
    }


def shard_status(shard_dir: Path, settings: dict) -> str:
    """"complete", "stale" (verifies but made otherwise), "corrupt" or "missing"."""
    if not (shard_dir / "manifest.json").exists():
        return "missing"
    if verify_shard(shard_dir):
        return "corrupt"
    manifest = read_manifest(shard_dir) or {}
    return "complete" if manifest.get("config") == settings else "stale"


class Backend(Protocol):
    """What `extract_shard` needs of a backend (`HFBackend`, `SGLangBackend`)."""

    def extract(self, records: Sequence[dict[str, Any]],
                batch_tokens: int) -> Iterator[BatchResult]: ...


_BACKENDS: dict[tuple, Backend] = {}
_BACKENDS_LOCK = threading.Lock()


SPOOL_NAME = ".sglang-spool"


def make_backend(model_dir: Path, aux_layers: list[int], cfg: ExtractConfig, *,
                 trust_remote_code: bool = False, out_root: Path | None = None) -> Backend:
    """A new backend of kind ``cfg.backend`` ("hf" or "sglang") for this target and settings.

    The SGLang backend imports SGLang only when its engine starts (first batch); its
    settings errors (layers SGLang cannot capture) are raised here, before any work. Its
    spool is ``cfg.spool_dir``, else ``.sglang-spool`` beside `out_root` (``hidden/`` for
    ``hidden/<split>``: one spool, and one engine, for every split), else the temporary
    folder."""
    if cfg.backend == "sglang":
        from eyas.extract.sglang_backend import SGLangBackend

        spool = (Path(cfg.spool_dir) if cfg.spool_dir
                 else Path(out_root).absolute().parent / SPOOL_NAME if out_root is not None
                 else None)
        return SGLangBackend(model_dir, aux_layers=aux_layers, storage=cfg.storage,
                             topk=cfg.topk, dtype=cfg.dtype, tp_size=cfg.tp_size,
                             trust_remote_code=trust_remote_code, spool_root=spool,
                             engine_args=cfg.engine_args,
                             engine_timeout_s=cfg.engine_timeout_s)
    import torch

    compute = None if cfg.compute_dtype == "auto" else getattr(torch, cfg.compute_dtype)
    return HFBackend(model_dir, aux_layers=aux_layers, storage=cfg.storage, topk=cfg.topk,
                     dtype=cfg.dtype, device=cfg.device, trust_remote_code=trust_remote_code,
                     compute_dtype=compute)


def get_backend(model_dir: Path, aux_layers: list[int], cfg: ExtractConfig, *,
                trust_remote_code: bool = False, out_root: Path | None = None) -> Backend:
    """A loaded backend for this target and settings, reused across the shards of a process.

    One model per device (``cfg.device``): other settings on the same device replace the
    backend held there, which is closed first (an SGLang engine frees its GPUs). Safe to call
    from several threads; a backend serves one shard at a time (whoever runs shards at once
    gives each its own device). `trust_remote_code` lets transformers run the model folder's
    own code (Kimi/DeepSeek)."""
    key = (cfg.backend, str(Path(model_dir).resolve()), tuple(aux_layers), cfg.storage,
           cfg.topk, cfg.dtype, cfg.compute_dtype, cfg.tp_size, cfg.spool_dir, cfg.engine_timeout_s,
           trust_remote_code,
           json.dumps(cfg.engine_args, sort_keys=True, default=str),
           str(Path(out_root).absolute().parent)
           if cfg.backend == "sglang" and not cfg.spool_dir and out_root is not None else None,
           cfg.device)  # the device last: one backend per device
    with _BACKENDS_LOCK:
        if key not in _BACKENDS:
            for old in [k for k in _BACKENDS if k[-1] == cfg.device]:
                _close(_BACKENDS.pop(old))
            _BACKENDS[key] = make_backend(model_dir, aux_layers, cfg,
                                          trust_remote_code=trust_remote_code, out_root=out_root)
        return _BACKENDS[key]


def _close(backend: Backend) -> None:
    close = getattr(backend, "close", None)
    if close is not None:
        close()


def close_backends() -> None:
    """Close and forget the cached backends (those with a ``close()``, e.g. SGLang's engine)."""
    with _BACKENDS_LOCK:
        backends = list(_BACKENDS.values())
        _BACKENDS.clear()
    for backend in backends:
        _close(backend)


def check_existing_output(out_root: Path, hidden_size: int, model_dir: Path) -> None:
    """Refuse to mix targets of different widths in one output folder (ConfigError)."""
    for shard in list_shards(out_root, check_hashes=False):
        record = read_shard_manifest(shard)
        if record["hidden_size"] != hidden_size:
            raise ConfigError(
                f"target {model_dir} has hidden size {hidden_size}, but {shard} holds states of "
                f"hidden size {record['hidden_size']} (another target?). Use another output "
                f"folder or delete the old shards.",
                where="target.model",
            )


def extract_shard(spec: ShardSpec, model_dir: Path, out_root: Path, cfg: ExtractConfig,
                  *, backend: Backend | None = None,
                  trust_remote_code: bool = False) -> dict[str, Any]:
    """Extract one shard into ``out_root/shard-NNNNN`` unless it is already complete.

    First deletes the temporary folders of this shard's killed writers (`remove_dead_writers`).
    `backend` (anything with ``extract(records, batch_tokens)``) overrides the one
    ``cfg.backend`` selects (`get_backend`: HF by default, reused across shards).

    Returns ``{"shard", "status": "skipped"|"extracted", "previous": <status before>,
    "samples", "tokens", "quarantined", "bytes", "seconds"}``. Raises ConfigError before any
    forward pass when the configured layers do not fit the target's depth, or when the
    output folder holds states of another hidden size; `eyas.stopping.StopRequested` when a
    stop was requested: before anything when it came before this shard (a shard boundary:
    finished shards are kept), else after the forward batch under way (the shard is not
    written, unless that batch was its last).
    """
    # A stop (SIGTERM, Ctrl-C; `eyas.stopping`, seen from a flow's worker thread too) waits
    # for a forward batch: no shard starts after it, and the shard under way is abandoned --
    # nothing of it is written, it is redone by the rerun -- rather than finished; unless its
    # last batch is done, when writing it is all that is left.
    stopping.check(f"extraction stopped before {spec.name}")
    t0 = time.monotonic()
    out_root, model_dir = Path(out_root), Path(model_dir)
    aux_layers, shape = resolve_aux_layers(model_dir, cfg.aux_layers)
    fingerprint = target_fingerprint(model_dir)
    settings = shard_settings(spec, cfg, aux_layers, fingerprint)
    shard_dir = out_root / spec.name
    for left in remove_dead_writers(out_root, spec.name):
        log.info("deleted %s, left by a shard writer that was killed", left)
    previous = shard_status(shard_dir, settings)
    if previous == "complete":
        record = read_shard_manifest(shard_dir)
        return _summary(spec, "skipped", previous, record, shard_dir, t0)
    check_existing_output(out_root, shape.hidden_size, model_dir)
    records = read_records(spec)
    backend = backend or get_backend(model_dir, aux_layers, cfg,
                                     trust_remote_code=trust_remote_code, out_root=out_root)
    results: dict[str, dict] = {}
    quarantined: list[dict[str, str]] = []
    batches = backend.extract(records, cfg.batch_tokens)
    try:
        for batch in batches:
            for sample in batch.samples:
                results[sample["id"]] = sample
            quarantined.extend(batch.quarantined)
            if len(results) + len(quarantined) < len(records):
                stopping.check(f"{spec.name} abandoned after {len(results)} of "
                               f"{len(records)} samples (not written; the rerun extracts it "
                               "again)")
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # a generator backend frees what it holds for the batch now, not at GC
    if quarantined and not cfg.quarantine_nonfinite:
        raise DataError(f"non-finite states: {quarantined[0]['reason']}",
                        path=spec.merged_file, field=f"id={quarantined[0]['id']}")
    ordered = [results[r["id"]] for r in records if r["id"] in results]
    record = write_shard(
        shard_dir, ordered, storage=cfg.storage, aux_layers=aux_layers,
        hidden_size=shape.hidden_size, dtype=cfg.dtype, topk=cfg.topk,
        target_fingerprint=fingerprint, quarantined=quarantined, config=settings,
        inputs=None,
    )
    return _summary(spec, "extracted", previous, record, shard_dir, t0)


def complete_record(spec: ShardSpec, shard_dir: Path) -> dict[str, Any]:
    """The row `extract_shard` returns for a shard it finds complete (status "skipped"),
    read from the shard's manifest without loading a backend."""
    return _summary(spec, "skipped", "complete", read_shard_manifest(shard_dir), shard_dir,
                    time.monotonic())


def _summary(spec, status, previous, record, shard_dir, t0) -> dict[str, Any]:
    return {
        "shard": spec.name,
        "status": status,
        "previous": previous,
        "samples": record["num_samples"],
        "tokens": record["num_tokens"],
        "quarantined": record["num_quarantined"],
        "bytes": (shard_dir / DATA_NAME).stat().st_size,
        "seconds": round(time.monotonic() - t0, 3),
    }

"""Hidden-state shards on disk: one safetensors file plus a manifest per shard. No pickles.

A shard folder ``<root>/shard-00000/`` holds ``data.safetensors``, an optional
``quarantine.jsonl`` (samples dropped for NaN/inf, one ``{"id", "reason"}`` per line) and
``manifest.json``, written last. The folder is assembled under a temporary name beside it and
renamed into place, so a reader sees a complete shard or none; an interrupted writer leaves
only a ``.tmp-*`` folder, which no reader lists.

Tensors (all samples concatenated along the token axis, N tokens, S samples):
``input_ids`` [N] int32, ``loss_mask`` [N] uint8, ``offsets`` [S+1] int64,
``aux_hidden`` [N, 3H] (bf16 by default), and for storage "final" ``final_hidden`` [N, H],
for storage "topk" ``topk_ids`` [N, K] int32 and ``topk_logprobs`` [N, K] float16.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from eyas.errors import DataError
from eyas.io import AtomicJsonlWriter, read_json, sha256_file, write_json
from eyas.manifest import MANIFEST_NAME, verify_manifest, write_manifest

DATA_NAME = "data.safetensors"
QUARANTINE_NAME = "quarantine.jsonl"
SHARD_PREFIX = "shard-"
STORAGES = ("final", "topk")
TEACHER_TENSORS = {"final": ("final_hidden",), "topk": ("topk_ids", "topk_logprobs")}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def shard_name(index: int) -> str:
    """Folder name of shard `index`: ``shard-00000``."""
    return f"{SHARD_PREFIX}{index:05d}"


def write_shard(
    shard_dir: Path,
    samples: Sequence[dict[str, Any]],
    *,
    storage: str,
    aux_layers: Sequence[int],
    hidden_size: int,
    dtype: str = "bfloat16",
    topk: int | None = None,
    target_fingerprint: str = "",
    quarantined: Sequence[dict[str, str]] = (),
    config: dict | None = None,
    inputs: dict[str, str | Path] | None = None,
) -> dict:
    """Write one shard atomically; return its shard record (as ``read_shard_manifest``).

    Each sample is a dict with ``id`` (str), ``input_ids`` and ``loss_mask`` ([T] ints),
    ``aux_hidden`` [T, 3H] and the teacher tensors of `storage` (``final_hidden`` [T, H], or
    ``topk_ids`` / ``topk_logprobs`` [T, K]). `quarantined` lists ``{"id", "reason"}`` of
    samples left out. An existing `shard_dir` is replaced only once the new one is complete.
    Raises DataError when a sample's shapes disagree with `hidden_size` / `topk`.
    """
    if storage not in STORAGES:
        raise DataError(f"unknown storage {storage!r} (expected one of {STORAGES})", field="storage")
    shard_dir = Path(shard_dir)
    torch_dtype = DTYPES[dtype]
    tensors = _concat(samples, storage, hidden_size, topk, torch_dtype, shard_dir)
    record = {
        "storage": storage,
        "aux_layers": [int(i) for i in aux_layers],
        "hidden_size": int(hidden_size),
        "dtype": dtype,
        "topk": int(topk) if storage == "topk" else None,
        "num_samples": len(samples),
        "num_tokens": int(tensors["input_ids"].shape[0]),
        "sample_ids": [str(s["id"]) for s in samples],
        "token_counts": [int(len(s["input_ids"])) for s in samples],
        "num_quarantined": len(quarantined),
        "target_fingerprint": target_fingerprint,
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
                    for k, v in sorted(tensors.items())},
    }
    shard_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = shard_dir.parent / f".tmp-{shard_dir.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / DATA_NAME), metadata={"format": "pt"})  # one key: byte-identical reruns
        outputs = [DATA_NAME]
        if quarantined:
            with AtomicJsonlWriter(tmp / QUARANTINE_NAME) as writer:
                for q in quarantined:
                    writer.write({"id": str(q["id"]), "reason": str(q["reason"])})
            outputs.append(QUARANTINE_NAME)
        write_manifest(
            tmp, phase="extract", inputs=inputs, outputs=outputs, config=config or {},
            counts={"samples": record["num_samples"], "tokens": record["num_tokens"],
                    "quarantined": len(quarantined)},
        )
        manifest = read_json(tmp / MANIFEST_NAME)
        manifest["shard"] = record
        write_json(tmp / MANIFEST_NAME, manifest)
        _replace_dir(tmp, shard_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` onto `dst`, moving an existing `dst` aside first and deleting it after."""
    old = None
    if dst.exists():
        old = dst.parent / f".old-{dst.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(dst, old)
    os.rename(src, dst)
    with contextlib.suppress(OSError):
        fd = os.open(dst.parent, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _concat(samples, storage, hidden_size, topk, dtype, where) -> dict[str, torch.Tensor]:
    lengths = [len(s["input_ids"]) for s in samples]
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    if samples:
        offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    names = ("aux_hidden", *TEACHER_TENSORS[storage])
    for s in samples:
        t = len(s["input_ids"])
        expect = {"aux_hidden": (t, 3 * hidden_size), "final_hidden": (t, hidden_size),
                  "topk_ids": (t, topk), "topk_logprobs": (t, topk)}
        if len(s["loss_mask"]) != t:
            raise DataError(f"sample {s['id']}: loss_mask has {len(s['loss_mask'])} entries, "
                            f"input_ids {t}", path=where, field="loss_mask")
        for name in names:
            if name not in s:
                raise DataError(f"sample {s['id']}: missing tensor for storage {storage!r}",
                                path=where, field=name)
            if tuple(s[name].shape) != expect[name]:
                raise DataError(f"sample {s['id']}: shape {tuple(s[name].shape)}, expected "
                                f"{expect[name]}", path=where, field=name)

    def cat(name: str, cast: torch.dtype, width: int | None) -> torch.Tensor:
        parts = [torch.as_tensor(s[name]).to(cast) for s in samples]
        if parts:
            return torch.cat(parts, 0).contiguous()
        return torch.zeros((0, width) if width else (0,), dtype=cast)

    tensors = {
        "input_ids": cat("input_ids", torch.int32, None),
        "loss_mask": cat("loss_mask", torch.uint8, None),
        "offsets": offsets,
        "aux_hidden": cat("aux_hidden", dtype, 3 * hidden_size),
    }
    if storage == "final":
        tensors["final_hidden"] = cat("final_hidden", dtype, hidden_size)
    else:
        tensors["topk_ids"] = cat("topk_ids", torch.int32, topk)
        tensors["topk_logprobs"] = cat("topk_logprobs", torch.float16, topk)
    return tensors


def read_shard_manifest(shard_dir: Path) -> dict:
    """The shard record of a shard's manifest.

    Keys: ``storage`` ("final"|"topk"), ``aux_layers``, ``hidden_size``, ``dtype``, ``topk``,
    ``num_samples``, ``num_tokens``, ``sample_ids``, ``token_counts``, ``num_quarantined``,
    ``target_fingerprint``, ``tensors`` ({name: {shape, dtype}}). Raises DataError when the
    shard has no manifest or the manifest has no shard record.
    """
    path = Path(shard_dir) / MANIFEST_NAME
    if not path.exists():
        raise DataError("no manifest (shard missing or interrupted)", path=path)
    manifest = read_json(path)
    if "shard" not in manifest:
        raise DataError("not a hidden-state shard manifest", path=path, field="shard")
    return manifest["shard"]


def verify_shard(shard_dir: Path, *, check_hashes: bool = True) -> list[str]:
    """Problems that make `shard_dir` not a complete shard; empty when it verifies.

    Checks: the manifest exists and is complete, each listed file's size and (with
    `check_hashes`) SHA-256 match, and each tensor's shape and dtype in the safetensors
    header match the manifest's record.
    """
    shard_dir = Path(shard_dir)
    problems = verify_manifest(shard_dir, check_hashes=check_hashes)
    if problems:
        return problems
    try:
        record = read_shard_manifest(shard_dir)
    except DataError as exc:
        return [str(exc)]
    data = shard_dir / DATA_NAME
    try:
        with safe_open(str(data), framework="pt") as fh:
            keys = set(fh.keys())
            for name, meta in record["tensors"].items():
                if name not in keys:
                    problems.append(f"{data}: tensor {name!r} listed in the manifest but missing")
                    continue
                sl = fh.get_slice(name)
                if list(sl.get_shape()) != meta["shape"]:
                    problems.append(f"{data}: tensor {name!r} has shape {sl.get_shape()}, "
                                    f"manifest says {meta['shape']}")
    except (SafetensorError, OSError) as exc:
        problems.append(f"{data}: unreadable safetensors file ({exc})")
    return problems


def is_shard_complete(shard_dir: Path, *, check_hashes: bool = True) -> bool:
    """True when `shard_dir` verifies (see `verify_shard`)."""
    return not verify_shard(shard_dir, check_hashes=check_hashes)


def list_shards(root: Path, *, check_hashes: bool = True) -> list[Path]:
    """Shard folders under `root` whose manifest verifies, sorted by name.

    Temporary (``.tmp-*``) and unverified folders are left out.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    return [p for p in sorted(root.iterdir())
            if p.is_dir() and p.name.startswith(SHARD_PREFIX)
            and is_shard_complete(p, check_hashes=check_hashes)]


def iter_samples(shard_dir: Path) -> Iterator[dict[str, torch.Tensor]]:
    """Yield each sample of a shard, reading only that sample's rows.

    Per sample: ``input_ids`` [T] long, ``loss_mask`` [T] long, ``aux_hidden`` [T, 3H] and
    either ``final_hidden`` [T, H] or ``topk_ids`` [T, K] (long) + ``topk_logprobs`` [T, K]
    (float16). Does not verify checksums (call `verify_shard` / `list_shards` first).
    """
    shard_dir = Path(shard_dir)
    record = read_shard_manifest(shard_dir)
    names = ("aux_hidden", *TEACHER_TENSORS[record["storage"]])
    with safe_open(str(shard_dir / DATA_NAME), framework="pt") as fh:
        offsets = fh.get_tensor("offsets").tolist()
        input_ids = fh.get_tensor("input_ids").long()
        loss_mask = fh.get_tensor("loss_mask").long()
        slices = {name: fh.get_slice(name) for name in names}
        for a, b in zip(offsets, offsets[1:], strict=False):
            sample = {"input_ids": input_ids[a:b], "loss_mask": loss_mask[a:b]}
            for name, sl in slices.items():
                sample[name] = sl[a:b]
            if "topk_ids" in sample:
                sample["topk_ids"] = sample["topk_ids"].long()
            yield sample


def read_quarantine(shard_dir: Path) -> list[dict]:
    """The quarantined samples (``{"id", "reason"}``) of a shard; empty when none."""
    path = Path(shard_dir) / QUARANTINE_NAME
    if not path.exists():
        return []
    from eyas.io import iter_jsonl

    return [obj for _, obj in iter_jsonl(path)]


def data_checksum(shard_dir: Path) -> str:
    """SHA-256 of a shard's data file (for tests and reports)."""
    return sha256_file(Path(shard_dir) / DATA_NAME)

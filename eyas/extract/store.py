"""Hidden-state shards on disk: one safetensors file plus a manifest per shard. No pickles.

A shard folder ``<root>/shard-00000/`` holds ``data.safetensors``, an optional
``quarantine.jsonl`` (samples dropped for NaN/inf, one ``{"id", "reason"}`` per line) and
``manifest.json``, written last. The folder is assembled under a temporary name beside it and
renamed into place, so a reader sees a complete shard or none; an interrupted writer leaves
only a ``.tmp-*`` (or, killed mid-swap, ``.old-*``) folder, which no reader lists and the next
extraction deletes once its process is gone (`remove_dead_writers`).

Tensors (all samples concatenated along the token axis, N tokens, S samples):
``input_ids`` [N] int32, ``loss_mask`` [N] uint8, ``offsets`` [S+1] int64,
``aux_hidden`` [N, 3H] (bf16 by default), and for storage "final" ``final_hidden`` [N, H],
for storage "topk" ``topk_ids`` [N, K] int32 and ``topk_logprobs`` [N, K] float16.
Storage "compact" keeps the top-k teacher of "topk" but stores the aux states in float8
(e4m3): ``aux_fp8`` [N, 3H] float8_e4m3fn and ``aux_scale`` [N, 3] float32, one scale per
token per layer (the row's max magnitude / 448), so a row dequantises to
``aux_fp8 * aux_scale`` within 1/16 of its max magnitude. Readers (`read_rows`,
`iter_samples`) return ``aux_hidden`` in bf16 for every storage, so a trainer never sees the
difference.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from eyas.errors import DataError
from eyas.io import AtomicJsonlWriter, read_json, replace_dir, sha256_file, write_json
from eyas.manifest import MANIFEST_NAME, verify_manifest, write_manifest
from eyas.verified import HASH_THREADS

DATA_NAME = "data.safetensors"
QUARANTINE_NAME = "quarantine.jsonl"
SHARD_PREFIX = "shard-"
STORAGES = ("final", "topk", "compact")
TEACHER_TENSORS = {"final": ("final_hidden",), "topk": ("topk_ids", "topk_logprobs"),
                   "compact": ("topk_ids", "topk_logprobs")}
"""Teacher tensors of each storage, as readers return them."""
AUX_TENSORS = {"final": ("aux_hidden",), "topk": ("aux_hidden",),
               "compact": ("aux_fp8", "aux_scale")}
"""Tensors that hold the aux states in the file, per storage."""
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
AUX_GROUPS = 3  # one scale per aux layer per token


def quantize_aux(aux_TX: torch.Tensor, groups: int = AUX_GROUPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Float8 (e4m3) rows with one float32 scale per token per layer.

    `aux_TX` [T, G*H] (any float dtype, any device) -> (``aux_fp8`` [T, G*H] float8_e4m3fn,
    ``aux_scale`` [T, G] float32) with ``aux_fp8 * aux_scale`` ~ `aux_TX`: each element is off
    by at most 1/16 of its group's max magnitude. An all-zero group gets scale 0.
    """
    t, x = aux_TX.shape
    if x % groups:
        raise DataError(f"aux width {x} is not a multiple of {groups} layers", field="aux_hidden")
    rows = aux_TX.float().reshape(t, groups, x // groups)
    amax = rows.abs().amax(dim=-1, keepdim=True)
    scale = amax / FP8_MAX
    q = (rows / torch.where(scale > 0, scale, torch.ones_like(scale))).clamp(-FP8_MAX, FP8_MAX)
    return q.to(FP8).reshape(t, x), scale.reshape(t, groups)


def dequantize_aux(aux_fp8: torch.Tensor, aux_scale: torch.Tensor,
                   dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Inverse of `quantize_aux`: [T, G*H] in `dtype`."""
    t, x = aux_fp8.shape
    groups = aux_scale.shape[-1]
    rows = aux_fp8.float().reshape(t, groups, x // groups) * aux_scale.float().unsqueeze(-1)
    return rows.reshape(t, x).to(dtype)


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
    ``topk_ids`` / ``topk_logprobs`` [T, K]; storage "compact" takes the same as "topk" and
    quantises ``aux_hidden``, or takes it already quantised as ``aux_fp8`` [T, 3H] +
    ``aux_scale`` [T, 3], see `quantize_aux`). `quarantined` lists ``{"id", "reason"}`` of
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
        "dtype": "float8_e4m3fn" if storage == "compact" else dtype,
        "topk": int(topk) if storage in ("topk", "compact") else None,
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
        replace_dir(tmp, shard_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _concat(samples, storage, hidden_size, topk, dtype, where) -> dict[str, torch.Tensor]:
    lengths = [len(s["input_ids"]) for s in samples]
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    if samples:
        offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    for s in samples:
        t = len(s["input_ids"])
        expect = {"aux_hidden": (t, 3 * hidden_size), "final_hidden": (t, hidden_size),
                  "topk_ids": (t, topk), "topk_logprobs": (t, topk),
                  "aux_fp8": (t, 3 * hidden_size), "aux_scale": (t, AUX_GROUPS)}
        aux = ("aux_fp8", "aux_scale") if storage == "compact" and "aux_fp8" in s else ("aux_hidden",)
        names = (*aux, *TEACHER_TENSORS[storage])
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
    }
    if storage == "compact":
        # quantised per sample, so the shard never holds a second float copy of all rows
        pairs = [(s["aux_fp8"], s["aux_scale"]) if "aux_fp8" in s
                 else quantize_aux(torch.as_tensor(s["aux_hidden"])) for s in samples]
        if pairs:
            tensors["aux_fp8"] = torch.cat([q.to(FP8) for q, _ in pairs], 0).contiguous()
            tensors["aux_scale"] = torch.cat([sc.float() for _, sc in pairs], 0).contiguous()
        else:
            tensors["aux_fp8"] = torch.zeros((0, 3 * hidden_size), dtype=FP8)
            tensors["aux_scale"] = torch.zeros((0, AUX_GROUPS), dtype=torch.float32)
    else:
        tensors["aux_hidden"] = cat("aux_hidden", dtype, 3 * hidden_size)
    if storage == "final":
        tensors["final_hidden"] = cat("final_hidden", dtype, hidden_size)
    else:
        tensors["topk_ids"] = cat("topk_ids", torch.int32, topk)
        tensors["topk_logprobs"] = cat("topk_logprobs", torch.float16, topk)
    return tensors


def read_shard_manifest(shard_dir: Path) -> dict:
    """The shard record of a shard's manifest.

    Keys: ``storage`` ("final"|"topk"|"compact"), ``aux_layers``, ``hidden_size``, ``dtype``, ``topk``,
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


_WRITER_FOLDER = re.compile(r"\.(?:tmp|old)-(shard-\d+)-(\d+)-[0-9a-f]+")
"""``.tmp-<shard>-<pid>-<hex>`` (`write_shard`) and ``.old-<shard>-<pid>-<hex>``
(`eyas.io.replace_dir`): a shard writer's folders, named by its process."""


def remove_dead_writers(root: Path, name: str | None = None) -> list[Path]:
    """Delete the temporary folders under `root` (of shard `name` only, when given) left by
    shard writers whose process is gone (killed mid-shard: each can be as large as a
    shard); return them. A live process's folders are left alone."""
    from eyas.proc import pid_alive

    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for entry in sorted(root.iterdir()):
        match = _WRITER_FOLDER.fullmatch(entry.name)
        if (match and (name is None or match.group(1) == name) and entry.is_dir()
                and not pid_alive(int(match.group(2)))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def list_shards(root: Path, *, check_hashes: bool = True) -> list[Path]:
    """Shard folders under `root` whose manifest verifies, sorted by name.

    Temporary (``.tmp-*``) and unverified folders are left out. Shards are verified
    `eyas.verified.HASH_THREADS` at a time; a data file its writer hashed (extraction) and
    nothing changed since is not read (`eyas.verified`).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in sorted(root.iterdir()) if p.is_dir() and p.name.startswith(SHARD_PREFIX)]
    if check_hashes:  # one thread per file hashed (hashlib releases the GIL): not one core
        with ThreadPoolExecutor(max_workers=max(1, min(HASH_THREADS, len(found)))) as pool:
            complete = list(pool.map(is_shard_complete, found))
    else:
        complete = [is_shard_complete(p, check_hashes=False) for p in found]
    return [p for p, ok in zip(found, complete, strict=True) if ok]


def read_rows(fh: Any, storage: str, start: int, stop: int, *,
              dequantize: bool = True) -> dict[str, torch.Tensor]:
    """Rows ``[start, stop)`` of an open shard file (``safe_open(..., framework="pt")``).

    Returns ``input_ids`` / ``loss_mask`` [T] long, ``aux_hidden`` [T, 3H] (dequantised to
    bf16 for storage "compact", as stored otherwise) and the teacher tensors of `storage`
    (``topk_ids`` as long). The one place that knows how each storage lays out its rows.
    With `dequantize` False, storage "compact" gives ``aux_fp8`` and ``aux_scale`` as stored
    instead of ``aux_hidden`` (for `dequantize_aux` on the training device).
    """
    out = {"input_ids": fh.get_slice("input_ids")[start:stop].long(),
           "loss_mask": fh.get_slice("loss_mask")[start:stop].long()}
    if storage == "compact" and not dequantize:
        out["aux_fp8"] = fh.get_slice("aux_fp8")[start:stop]
        out["aux_scale"] = fh.get_slice("aux_scale")[start:stop]
    elif storage == "compact":
        out["aux_hidden"] = dequantize_aux(fh.get_slice("aux_fp8")[start:stop],
                                           fh.get_slice("aux_scale")[start:stop])
    else:
        out["aux_hidden"] = fh.get_slice("aux_hidden")[start:stop]
    for name in TEACHER_TENSORS[storage]:
        out[name] = fh.get_slice(name)[start:stop]
    if "topk_ids" in out:
        out["topk_ids"] = out["topk_ids"].long()
    return out


def iter_samples(shard_dir: Path) -> Iterator[dict[str, torch.Tensor]]:
    """Yield each sample of a shard, reading only that sample's rows.

    Per sample: ``input_ids`` [T] long, ``loss_mask`` [T] long, ``aux_hidden`` [T, 3H] (bf16
    for storage "compact", dequantised) and either ``final_hidden`` [T, H] (storage "final")
    or ``topk_ids`` [T, K] (long) + ``topk_logprobs`` [T, K] float16 ("topk" and "compact").
    Does not verify checksums (call `verify_shard` / `list_shards` first).
    """
    shard_dir = Path(shard_dir)
    storage = read_shard_manifest(shard_dir)["storage"]
    with safe_open(str(shard_dir / DATA_NAME), framework="pt") as fh:
        offsets = fh.get_tensor("offsets").tolist()
        for a, b in zip(offsets, offsets[1:], strict=False):
            yield read_rows(fh, storage, a, b)


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

"""Disk planning: bytes per token for each storage format, and a refusal when space is short.

Per token, with hidden size H, storage dtype of b bytes (2 for bf16) and K for top-k:

=========  =========================================  ======================
storage    tensors                                    bytes/token
=========  =========================================  ======================
final      aux 3H + final H (b each), ids, mask       4·H·b + 5
topk       aux 3H (b each), K ids (int32) + K fp16    3·H·b + 6·K + 5
compact    aux 3H in fp8 + 3 fp32 scales, top-K        3·H + 12 + 6·K + 5
SpecForge  aux 3H + final H in bf16 (reference)       8·H
=========  =========================================  ======================

("ids, mask" = 4 + 1 bytes; the per-sample offsets and the file header are counted as a small
per-shard overhead.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

# Sizes and the refusal live in eyas.disk (shared with the status probe); named here too.
from eyas.disk import DTYPE_BYTES, DiskSpaceError, dtype_bytes, human_bytes, require_free

__all__ = ["DTYPE_BYTES", "DiskSpaceError", "bytes_per_token", "check_disk", "estimate_bytes",
           "free_bytes", "human_bytes", "specforge_bytes_per_token"]

TOKEN_META_BYTES = 4 + 1  # input_ids int32 + loss_mask uint8
SHARD_OVERHEAD_BYTES = 1024  # safetensors header (the manifest is a few KiB more, not counted)


def bytes_per_token(hidden_size: int, storage: str, *, dtype: str = "bfloat16", topk: int = 32) -> int:
    """Bytes one token occupies in a shard of `storage` ("final" | "topk" | "compact").

    `dtype` is the hidden-state dtype of "final" and "topk"; "compact" always stores float8.
    """
    b = dtype_bytes(dtype)
    if storage == "final":
        return 4 * hidden_size * b + TOKEN_META_BYTES
    if storage == "topk":
        return 3 * hidden_size * b + topk * (4 + 2) + TOKEN_META_BYTES
    if storage == "compact":
        return 3 * hidden_size + 3 * 4 + topk * (4 + 2) + TOKEN_META_BYTES
    raise ValueError(f"unknown storage {storage!r} (expected 'final', 'topk' or 'compact')")


def specforge_bytes_per_token(hidden_size: int) -> int:
    """SpecForge's offline format: final + 3 aux states in bf16 = 8·H bytes per token."""
    return 8 * hidden_size


def estimate_bytes(num_tokens: int, num_samples: int, num_shards: int, hidden_size: int,
                   storage: str, *, dtype: str = "bfloat16", topk: int = 32) -> int:
    """Bytes the shards of an extraction will take on disk."""
    return (num_tokens * bytes_per_token(hidden_size, storage, dtype=dtype, topk=topk)
            + 8 * (num_samples + num_shards) + SHARD_OVERHEAD_BYTES * num_shards)


def _existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Free bytes on the volume holding `path` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing(path)).free


def check_disk(path: Path, needed: int, margin: float = 0.10, *, free: int | None = None) -> int:
    """Refuse (DiskSpaceError) unless the volume of `path` has ``needed * (1 + margin)`` free.

    `free` overrides the measured free space (for tests and for a remote host's figure).
    Returns the free bytes.
    """
    free = free_bytes(path) if free is None else free
    return require_free(needed, free, margin=margin, where=str(_existing(path)), what="extraction",
                        advice="Free space on that volume, point the output elsewhere, or "
                               "choose storage 'compact' (smallest).")

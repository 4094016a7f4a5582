"""Sizes on disk: bytes per value of each dtype, sizes for people, and the one refusal made
when free space is short (extraction's `check_disk`, the status probe's `check_fits`).

Sizes are written in powers of 1000 (``924.0 GB``, ``5.0 TB``), as ``df -H`` prints them and
as disks and volumes are sold; exact bytes below 1 kB.
"""

from __future__ import annotations

from eyas.errors import EyasError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
"""Bytes per value of each storage dtype, by its torch name."""
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "float8_e4m3fn"}
"""Short names people write for the same dtypes."""


class DiskSpaceError(EyasError):
    """A volume lacks the space a phase needs (the message names the place and the figures)."""


def dtype_bytes(dtype: str) -> int:
    """Bytes per value of `dtype` (a torch name or a short alias); ValueError when unknown."""
    name = DTYPE_ALIASES.get(dtype, dtype)
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of "
                         f"{sorted(DTYPE_BYTES) + sorted(DTYPE_ALIASES)}")
    return DTYPE_BYTES[name]


def human_bytes(n: float) -> str:
    """``1.5 GB``-style size (powers of 1000), exact bytes below 1 kB."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} PB"


def require_free(needed: int, free: int, *, margin: float = 0.10, reserve_bytes: int = 0,
                 where: str, what: str, advice: str) -> int:
    """Refuse (DiskSpaceError) unless ``free >= needed × (1 + margin) + reserve_bytes``.

    The message names `where` (a host, a path), `what` needs the space, every figure, and
    `advice` (what the user can do). Returns `free`.
    """
    required = int(needed * (1 + margin)) + reserve_bytes
    if free < required:
        reserve = f" + {human_bytes(reserve_bytes)} reserve" if reserve_bytes else ""
        raise DiskSpaceError(
            f"{where}: {what} needs {human_bytes(needed)} + {margin:.0%} margin{reserve} = "
            f"{human_bytes(required)}, but only {human_bytes(free)} is free. {advice}"
        )
    return free

"""Which torch device a setting names: the one reading of ``device: auto`` for every phase."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; anything else as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)

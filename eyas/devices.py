"""Which torch device a setting names (the one reading of ``device: auto`` for every phase), and
the devices of one host handed out one per running piece of work."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from eyas import stopping


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; anything else as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class DevicePool:
    """The devices of one host (``cuda:0`` here, ``0`` for a host's ``CUDA_VISIBLE_DEVICES``,
    ``cpu`` or ``""`` without GPUs), each held by one piece of work at a time (a shard)."""

    def __init__(self, devices: list[str]) -> None:
        self._free: queue.Queue[str] = queue.Queue()
        for d in devices:
            self._free.put(d)

    @contextmanager
    def take(self) -> Iterator[str]:
        """A free device while the block runs; a stop (`eyas.stopping`) ends the wait."""
        while True:
            try:
                device = self._free.get(timeout=0.5)
                break
            except queue.Empty:
                stopping.check("while waiting for a free device")
        try:
            yield device
        finally:
            self._free.put(device)

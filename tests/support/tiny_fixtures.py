"""Shared helpers for tests/unit/tiny: one tiny tokenizer per test process (training it takes seconds)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path


@functools.lru_cache(maxsize=1)
def shared_tokenizer_dir() -> Path:
    """A tiny tokenizer folder built once per process; removed at exit. Treat as read-only."""
    from eyas.tiny.tokenizer import build_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="eyas-tiny-tok-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return build_tokenizer(folder)

"""Names from `transformers`, imported safely from several threads at once.

`transformers` is a lazy module: ``from transformers import AutoTokenizer`` imports the submodule
on first use. Two threads doing that first import at the same time (tokenize tasks of several
datasets, shards extracted side by side in one flow) can see a half-made module and fail with
``ImportError: cannot import name 'AutoTokenizer'``. `transformers_names` takes a process-wide
lock around the lookup; later calls are cheap.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()


def transformers_names(*names: str) -> tuple[Any, ...]:
    """``transformers.<name>`` for each of `names`, looked up under one lock."""
    with _LOCK:
        import transformers

        return tuple(getattr(transformers, name) for name in names)

"""A tiny target LLM, its tokenizer and demo data, all built offline and deterministically.

The target's weights are trained once (hours on a CPU core, `eyas.tiny.weights`) and shipped
in ``eyas/assets/tiny_target``; `build_tiny_target` assembles the cached model folder from
them in seconds.

Public API (imported lazily, so ``import eyas.tiny.template`` stays cheap)::

    cache_dir() -> Path            (eyas.layout's, named here too)
    build_tokenizer(out_dir: Path) -> Path
    build_tiny_target(*, force=False) -> Path
    build_kimi_tokenizer(out_dir: Path, *, texts=None) -> Path
    build_kimi_replica(*, force=False) -> Path
    build_random_model(arch, out_dir, *, tokenizer_dir=None, seed=0) -> Path
    write_demo_datasets(out_dir: Path) -> dict[str, Path]
    CHAT_TEMPLATE: str
"""

from __future__ import annotations

import importlib
from typing import Any

from eyas.layout import CACHE_ENV, cache_dir

_LAZY = {
    "build_tokenizer": "eyas.tiny.tokenizer",
    "build_tiny_target": "eyas.tiny.build",
    "build_kimi_tokenizer": "eyas.tiny.kimi_tokenizer",
    "build_kimi_replica": "eyas.tiny.kimi_replica",
    "build_random_model": "eyas.tiny.random_models",
    "write_demo_datasets": "eyas.tiny.demo_data",
    "CHAT_TEMPLATE": "eyas.tiny.template",
}

__all__ = ["CACHE_ENV", "cache_dir", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eyas.tiny' has no attribute {name!r}")

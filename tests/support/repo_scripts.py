"""Load one of the repository's scripts or benchmarks (files outside any package) as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_module(path: Path) -> ModuleType:
    """The file at `path` (e.g. ``REPO / "scripts" / "gpu_check.py"``) run as a module named
    after it."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

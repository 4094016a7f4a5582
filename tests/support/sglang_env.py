"""Where the tests that hold eyas against SGLang's own code find it: a python that imports
SGLang (this one, or ``EYAS_SGLANG_PYTHON``), and SGLang's source tree (``EYAS_SGLANG_SOURCE``,
else where the wheel is unpacked on this machine)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

UNPACKED = Path("/tmp/sgl/wheel/sglang")
"""Where ``pip download sglang==0.5.23 --no-deps`` is unzipped on the development machine."""


def sglang_python(*, model_code: bool = False) -> str | None:
    """A python that imports SGLang, or None. With `model_code`, only one that also imports
    torch and transformers (SGLang's model classes need them; a side venv installed with
    ``--no-deps`` for the flag checks does not)."""
    if importlib.util.find_spec("sglang") is not None and not model_code:
        return sys.executable
    python = os.environ.get("EYAS_SGLANG_PYTHON") or None
    if python is None or not model_code:
        return python
    probe = subprocess.run([python, "-c", "import torch, transformers, sglang"],
                           capture_output=True, timeout=120)
    return python if probe.returncode == 0 else None


def sglang_source(marker: str) -> Path | None:
    """SGLang's package folder, when it holds `marker` (a path inside it), else None."""
    env = os.environ.get("EYAS_SGLANG_SOURCE")
    for cand in ([Path(env)] if env else []) + [UNPACKED]:
        if (cand / marker).exists():
            return cand
    return None

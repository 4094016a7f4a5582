"""Naming of Prefect artifacts: keys are lowercase letters, digits and dashes."""

from __future__ import annotations

import re


def artifact_key(*parts: str) -> str:
    """An artifact key from `parts` (``artifact_key("train", "Tiny Demo")`` → ``train-tiny-demo``)."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")[:60]

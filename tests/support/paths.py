"""Where the repository is, for tests that read its recipes, scripts and docs."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (tests/support/paths.py is two folders below it)."""

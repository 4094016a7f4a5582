"""Shared test setup: offline, Prefect analytics off, the tiny target built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# No hub traffic, ever: the project builds its models and data offline.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    """The tiny demo target (tokenizer + Llama model), built offline once and cached."""
    from eyas.tiny import build_tiny_target

    return build_tiny_target()

"""Shared test setup: offline, Prefect analytics off, the tiny target built once per session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# A Prefect home of this test process's own (each pytest-xdist worker has one), set before
# Prefect is imported: the commands and flows the tests start without a server of their own
# use a temporary one whose SQLite database lives there -- never the user's ~/.prefect, and
# never one that two workers write at once.
if "PREFECT_HOME" not in os.environ or os.environ.get("PYTEST_XDIST_WORKER"):
    _home = tempfile.mkdtemp(prefix=f"eyas-test-prefect-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["PREFECT_HOME"] = _home

from support.suite_order import longest_first  # noqa: E402

from eyas.cli import offline_defaults  # noqa: E402

# No hub traffic, ever (the project builds its models and data offline), no analytics:
# the same environment the `eyas` command sets up for itself.
offline_defaults()


@pytest.fixture(scope="session", autouse=True)
def slots_root(tmp_path_factory):
    """This session's slot pools (`eyas.slots`), apart from the machine's: every process the
    tests start inherits it."""
    import os

    from eyas.slots import SLOTS_ENV

    root = tmp_path_factory.mktemp("slots")
    old = os.environ.get(SLOTS_ENV)
    os.environ[SLOTS_ENV] = str(root)
    yield root
    if old is None:
        os.environ.pop(SLOTS_ENV, None)
    else:
        os.environ[SLOTS_ENV] = old


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    """The tiny demo target (tokenizer + Llama model), built offline once and cached."""
    from eyas.tiny import build_tiny_target

    return build_tiny_target()


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One temporary Prefect server (SQLite) for every flow test of the session."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-results")
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: storage}), prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def prefect_client(prefect_harness):
    """A synchronous Prefect client talking to the session's test server."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        yield client


def pytest_collection_modifyitems(config, items):
    """`gpu` tests are collected everywhere and skipped, with the reason, without a CUDA GPU;
    under pytest-xdist the longest files go first (`suite_order`)."""
    import torch

    if os.environ.get("PYTEST_XDIST_WORKER"):
        longest_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu): torch.cuda.is_available() is False here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

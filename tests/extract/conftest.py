"""Extraction tests: `gpu` tests are skipped (with the reason) where no CUDA device is visible."""

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker gpu); torch.cuda.is_available() "
                                   "is False here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

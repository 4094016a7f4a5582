"""Evaluator tests run torch on one thread: their matrices are tiny, and on a shared 2-core
machine OpenMP's spinning threads make them many times slower, not faster."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

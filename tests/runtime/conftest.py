"""Fixtures shared by the runtime's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def keep_torch_threads() -> Iterator[None]:
    """Restore torch's intra-op threads after a test that routes linears (routing resizes the thread pools)."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)

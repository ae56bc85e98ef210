"""benchmarks/kv_huge_pages.py swaps the runtime's pool placement for torch.zeros and puts it back."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.parametrize("huge", [False, True])
def test_pools_on_swaps_the_placement_only_inside_and_restores_it_after_an_error(huge: bool) -> None:
    from kv_huge_pages import pools_on

    from servegate.runtime.model import paged_attention

    placed = paged_attention._pool
    with pytest.raises(RuntimeError, match="inside"):
        with pools_on(huge):
            assert paged_attention._pool is not placed
            pool = paged_attention._pool((4, 2**16, 16), torch.float32, "cpu", not huge)  # 16 MiB
            assert pool.shape == (4, 2**16, 16) and pool.dtype == torch.float32 and not pool.any()
            if huge and hasattr(mmap, "MADV_HUGEPAGE"):  # asked for huge pages despite the runtime's `not huge`
                assert pool.data_ptr() % (2 * 2**20) == 0
            raise RuntimeError("inside")
    assert paged_attention._pool is placed


def test_the_read_rate_is_a_positive_figure() -> None:
    from kv_huge_pages import huge_kib, read_rate

    assert read_rate(torch.ones(2**20), rounds=2) > 0
    assert huge_kib() >= 0

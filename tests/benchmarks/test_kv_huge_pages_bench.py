"""benchmarks/kv_huge_pages.py swaps the runtime's pool placement for torch.zeros and puts it back."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_small_page_pools_swaps_the_placement_only_inside_and_restores_it_after_an_error() -> None:
    from kv_huge_pages import small_page_pools

    from servegate.runtime.model import paged_attention

    placed = paged_attention._pool
    with pytest.raises(RuntimeError, match="inside"):
        with small_page_pools():
            assert paged_attention._pool is not placed
            pool = paged_attention._pool((2, 4, 8), torch.bfloat16, "cpu")
            assert pool.shape == (2, 4, 8) and pool.dtype == torch.bfloat16 and not pool.any()
            raise RuntimeError("inside")
    assert paged_attention._pool is placed
    big = placed((4, 2**16, 16), torch.float32, "cpu")  # 16 MiB: the runtime's placement again
    assert big.data_ptr() % (2 * 2**20) == 0 or not hasattr(mmap, "MADV_HUGEPAGE")


def test_the_read_rate_is_a_positive_figure() -> None:
    from kv_huge_pages import huge_kib, read_rate

    assert read_rate(torch.ones(2**20), rounds=2) > 0
    assert huge_kib() >= 0

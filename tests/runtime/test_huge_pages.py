"""KV pools on 2 MiB pages: the same zeroed tensors as torch.zeros, in a range Linux may back with huge pages."""

from __future__ import annotations

import gc
import mmap
import sys
from pathlib import Path

import pytest
import torch

from servegate.runtime.model import huge_pages
from servegate.runtime.model.huge_pages import HUGE_CACHE_MIN, HUGE_PAGE, huge_page_zeros, wants_huge_pages
from servegate.runtime.model.paged_attention import PagedKVCache

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    """The bracketed mode of transparent huge pages, or None where the kernel has none."""
    if not sys.platform.startswith("linux") or not THP.exists():
        return None
    text = THP.read_text()
    return text[text.index("[") + 1 : text.index("]")]


def _mapping_fields(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds `address`."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_a_pool_is_a_zeroed_contiguous_tensor_that_keeps_its_writes(dtype):
    shape = (3, 4 * HUGE_PAGE // 64 + 5, 64)  # several huge pages and an odd tail
    pool = huge_page_zeros(shape, dtype)
    assert pool.shape == shape and pool.dtype == dtype and pool.is_contiguous()
    assert not pool.any()
    pool[2, -1, -1] = 7
    pool[0, 0, 0] = 3
    view = pool[2]
    del pool
    gc.collect()  # the view alone keeps the mapping alive
    assert view[-1, -1].item() == 7
    assert int(view.count_nonzero()) == 1


def test_a_small_pool_is_plain_zeros():
    pool = huge_page_zeros((2, 8, 16), torch.float32)
    assert pool.shape == (2, 8, 16) and not pool.any()
    pool.add_(1)
    assert float(pool.sum()) == 2 * 8 * 16


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off here")
def test_the_pool_is_advised_for_huge_pages():
    pool = huge_page_zeros((4, HUGE_PAGE // 32, 16), torch.float32)  # 8 MiB
    fields = _mapping_fields(pool.data_ptr())
    assert "hg" in fields.get("VmFlags", "").split(), fields  # MADV_HUGEPAGE took
    assert pool.data_ptr() % HUGE_PAGE == 0  # aligned, so every whole 2 MiB of it can be one page


def test_only_a_large_cpu_cache_wants_huge_pages():
    assert wants_huge_pages(HUGE_CACHE_MIN, "cpu") and wants_huge_pages(4 * HUGE_CACHE_MIN, torch.device("cpu"))
    assert not wants_huge_pages(HUGE_CACHE_MIN - 1, "cpu")
    assert not wants_huge_pages(4 * HUGE_CACHE_MIN, "meta")  # another device: its own allocator


def _small_cache() -> PagedKVCache:
    """16 MiB of float32 pools: 2 layers, 4 KV heads, 512 blocks of 16, head size 64."""
    return PagedKVCache(
        num_layers=2, num_blocks=512, block_size=16, kv_heads=4, head_dim=64, dtype=torch.float32, device="cpu"
    )


def test_a_small_kv_cache_keeps_ordinary_pages():
    """Below HUGE_CACHE_MIN the pools are torch.zeros: an engine with a small cache starts without faulting in
    huge pages, which cost it start-up time for no measured gain."""
    cache = _small_cache()
    assert cache.nbytes() < HUGE_CACHE_MIN
    assert not any("hg" in _mapping_fields(t.data_ptr()).get("VmFlags", "").split() for t in cache.keys)


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this OS: plain zeros")
def test_the_kv_cache_places_cpu_pools_on_huge_pages_and_reads_back_what_it_wrote(monkeypatch):
    monkeypatch.setattr(huge_pages, "HUGE_CACHE_MIN", 8 * 2**20)  # so that a 16 MiB cache counts as large
    cache = _small_cache()
    assert all(t.data_ptr() % HUGE_PAGE == 0 for t in cache.keys + cache.values)
    assert cache.nbytes() == 2 * 2 * 4 * 512 * 16 * 64 * 4
    assert not any(t.any() for t in cache.keys + cache.values)
    slots = torch.tensor([5, 4000, 8191])
    key, value = torch.randn(4, 3, 64), torch.randn(4, 3, 64)
    cache.write(1, slots, key, value)
    assert torch.equal(cache.keys[1][:, slots], key) and torch.equal(cache.values[1][:, slots], value)
    assert int(cache.keys[1].count_nonzero()) == key.count_nonzero() and not cache.keys[0].any()

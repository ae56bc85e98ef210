"""New K/V rows whose slots follow one another are written as slices (runtime/model/slot_runs.py): the same pool
as index_copy_ row by row, which steps of short stretches keep."""

from __future__ import annotations

import pytest
import torch

from servegate.runtime.model.paged_attention import PagedKVCache
from servegate.runtime.model.slot_runs import MIN_RUN_ROWS, slot_runs


def test_long_stretches_become_runs_and_short_ones_do_not() -> None:
    # two prompts prefilled into their own consecutive blocks
    slots = list(range(32, 32 + 100)) + list(range(400, 400 + 60))
    assert slot_runs(slots) == [(32, 0, 100), (400, 100, 60)]
    # a decode step: one row per sequence, scattered
    assert slot_runs([5, 90, 17, 300]) is None
    # stretches of one 16-slot block each average too few rows for slices to pay
    blocks = [b * 16 + i for b in (3, 9, 4, 12) for i in range(16)]
    assert 16 < MIN_RUN_ROWS and slot_runs(blocks) is None
    assert slot_runs([]) is None


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_writing_runs_stores_what_index_copy_stores(kv_dtype: str) -> None:
    def cache() -> PagedKVCache:
        return PagedKVCache(
            num_layers=2, num_blocks=40, block_size=16, kv_heads=3, head_dim=8,
            dtype=torch.bfloat16, device="cpu", kv_dtype=kv_dtype,
        )  # fmt: skip

    slots = list(range(16, 16 + 130)) + list(range(480, 480 + 70))
    runs = slot_runs(slots)
    assert runs is not None and len(runs) == 2
    key, value = torch.randn(2, 3, len(slots), 8, dtype=torch.bfloat16)
    mapping = torch.tensor(slots)
    by_rows, by_runs = cache(), cache()
    by_rows.write(1, mapping, key, value)
    by_runs.write(1, mapping, key, value, runs)
    assert torch.equal(by_rows.keys[1], by_runs.keys[1]) and torch.equal(by_rows.values[1], by_runs.values[1])
    assert bool(by_runs.keys[1].any()) and not bool(by_runs.keys[0].any())

"""New K/V rows whose slots follow one another, found once per step so the pool's writes can copy them as slices.

A step's new rows go to their slots in the paged pool (`PagedKVCache.write`). A prompt whose blocks are consecutive
fills one stretch of slots; a decode step writes one row per sequence, anywhere.
"""

from __future__ import annotations

SlotRun = tuple[int, int, int]
"""(first slot, first row of the step, length): new rows whose slots follow one another."""

MIN_RUN_ROWS = 64
"""The shortest mean stretch for which slot_runs gives runs. A head-major pool's index_copy_ copies one head_dim row
at a time: 512 bfloat16 rows of 12 heads took 0.22 ms a write on a 2-core Xeon, 4 slices of 128 rows 0.05 ms. But each
slice is a dispatch of about 13 us, so 32 slices of 16 rows took 0.43 ms: slices pay only for long stretches."""


def slot_runs(slots: list[int]) -> list[SlotRun] | None:
    """`slots` as stretches of consecutive slots, or None when they average fewer than MIN_RUN_ROWS rows each."""
    runs: list[SlotRun] = []
    for row, slot in enumerate(slots):
        if runs and runs[-1][0] + runs[-1][2] == slot:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            if len(runs) * MIN_RUN_ROWS > len(slots):
                return None
            runs.append((slot, row, 1))
    return runs if runs and len(runs) * MIN_RUN_ROWS <= len(slots) else None

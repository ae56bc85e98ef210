"""Batching mode `static`: fixed batches of max_batch_size, filled for at most max_wait_ms.

A batch starts when max_batch_size requests wait or when the oldest has waited max_wait_ms, and runs
until its longest member ends. Like a padded [max_batch_size, max_len] batch, every slot and the memory
reserved for it stay with the batch until then: a member that finishes early leaves its slot empty
(reported as padded_slots) and nobody takes it. The paged runner computes no padding tokens, so the
outputs are exactly those of every other mode; only the batch shape and the waiting are static.
"""

from __future__ import annotations

from servegate.runtime.scheduling.request_level import RequestLevelScheduler


class StaticScheduler(RequestLevelScheduler):
    """Fixed-size batches that wait to fill and hold their slots to the end."""

    mode = "static"
    hold_finished_slots = True
    waits_to_fill = True

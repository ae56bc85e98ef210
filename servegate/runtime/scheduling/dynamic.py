"""Batching mode `dynamic`: request-level batches of whatever gathers within max_wait_ms.

A batch of up to max_batch_size starts when that many wait or when the oldest has waited max_wait_ms,
and runs to completion: no request joins it, but a member that finishes leaves at once, returning its
memory. The next batch starts when the last member ends.
"""

from __future__ import annotations

from servegate.runtime.scheduling.request_level import RequestLevelScheduler


class DynamicScheduler(RequestLevelScheduler):
    """Variable-size request-level batches gathered within a time window."""

    mode = "dynamic"
    waits_to_fill = True

"""Batching mode `none`: one request at a time, prompt then decode to the end, then the next."""

from __future__ import annotations

from dataclasses import replace

from servegate.runtime.scheduling.base import SchedulerConfig
from servegate.runtime.scheduling.kv_blocks import KVBlockManager
from servegate.runtime.scheduling.request_level import RequestLevelScheduler


class NoBatchingScheduler(RequestLevelScheduler):
    """A batch of exactly one request, started as soon as the previous one ends."""

    mode = "none"

    def __init__(self, config: SchedulerConfig, block_manager: KVBlockManager) -> None:
        super().__init__(replace(config, max_batch_size=1), block_manager)

"""Batching mode `offline`: a file of requests processed at maximum throughput (`gate run`).

The whole input is known and nobody waits on a single answer, so the step plan is the continuous
one (iteration-level admission, preemption by recompute) tuned for throughput: prompts are never
chunked (chunking only helps the latency of decodes running beside a long prefill), and when the
manifest declares no KV cache the pool holds max_batch_size sequences of max_model_len tokens.
"""

from __future__ import annotations

from dataclasses import replace

from servegate.runtime.scheduling.base import SchedulerConfig
from servegate.runtime.scheduling.continuous import ContinuousScheduler
from servegate.runtime.scheduling.kv_blocks import KVBlockManager


class OfflineScheduler(ContinuousScheduler):
    """Continuous batching without chunked prefill, for files."""

    mode = "offline"

    def __init__(self, config: SchedulerConfig, block_manager: KVBlockManager) -> None:
        super().__init__(replace(config, chunked_prefill=False), block_manager)

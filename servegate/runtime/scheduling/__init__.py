"""One scheduler per batching mode; `make_scheduler(mode, config, block_manager)` picks it.

kv_blocks.py is the KV block manager every scheduler allocates from; sequence.py a request's tokens as both see
them; output.py what a step hands the engine.
"""

from __future__ import annotations

from servegate.runtime.scheduling.base import Scheduler, SchedulerConfig
from servegate.runtime.scheduling.continuous import ContinuousScheduler
from servegate.runtime.scheduling.dynamic import DynamicScheduler
from servegate.runtime.scheduling.kv_blocks import KVBlockManager
from servegate.runtime.scheduling.none import NoBatchingScheduler
from servegate.runtime.scheduling.offline import OfflineScheduler
from servegate.runtime.scheduling.output import ScheduledChunk, SchedulerOutput
from servegate.runtime.scheduling.sequence import SeqStatus, Sequence
from servegate.runtime.scheduling.static import StaticScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.mode: cls
    for cls in (NoBatchingScheduler, StaticScheduler, DynamicScheduler, ContinuousScheduler, OfflineScheduler)
}
"""batching.mode -> scheduler class."""


def make_scheduler(mode: str, config: SchedulerConfig, block_manager: KVBlockManager) -> Scheduler:
    """The scheduler for a batching mode."""
    try:
        return SCHEDULERS[mode](config, block_manager)
    except KeyError:
        raise ValueError(f"unknown batching mode {mode!r}; known: {', '.join(SCHEDULERS)}") from None


__all__ = [
    "SCHEDULERS",
    "ContinuousScheduler",
    "DynamicScheduler",
    "NoBatchingScheduler",
    "OfflineScheduler",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SeqStatus",
    "Sequence",
    "StaticScheduler",
    "make_scheduler",
]

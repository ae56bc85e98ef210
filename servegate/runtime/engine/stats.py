"""The reference engine's live counters, read from its scheduler, KV pool, caches and fallback route."""

from __future__ import annotations

from servegate.runtime.engine.fallback_route import FallbackRoute
from servegate.runtime.engine.parts import EngineParts
from servegate.runtime.engine.request_table import RequestTable
from servegate.runtime.types import EngineStats


def engine_stats(table: RequestTable, parts: EngineParts | None, route: FallbackRoute | None) -> EngineStats:
    """Queue, batch, KV blocks, cache hits, fallback uses and preemptions right now (takes the engine lock)."""
    with table.lock:
        sched = table.scheduler
        if parts is None or sched is None:
            return EngineStats()
        bm, cache = sched.block_manager, parts.response_cache
        return EngineStats(
            queue_depth=sched.num_queued(),
            running=len(sched.running),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_free=bm.num_free_blocks,
            prefix_cache_hits=bm.hits,
            prefix_cache_misses=bm.misses,
            response_cache_hits=cache.hits if cache is not None else 0,
            fallback_uses=route.uses if route is not None else 0,
            preemptions=sched.num_preemptions,
        )

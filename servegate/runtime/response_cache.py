"""Whole-response cache for exactly repeated requests.

The key covers everything that decides a response: the manifest fingerprint (so a changed manifest
never serves an old answer), the prompt (text, messages or token ids), every sampling parameter, and,
unless the scope is global, the tenant (so one tenant never sees another's answers). Entries expire
after ttl_s and the least recently used goes first when max_entries is reached.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from servegate.contracts.sections import ResponseCache as ResponseCacheConfig
from servegate.runtime.types import FinishEvent, GenerationRequest, TokenEvent


class ResponseCache:
    """An LRU map request-key -> FinishEvent with a time to live; safe to share between threads."""

    def __init__(
        self, config: ResponseCacheConfig, fingerprint: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.fingerprint = fingerprint
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, FinishEvent]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def key(self, request: GenerationRequest) -> str:
        """The cache key of a request (sha256 hex)."""
        material = {
            "fingerprint": self.fingerprint,
            "tenant": request.tenant if self.config.scope == "tenant" else None,
            "prompt": request.prompt,
            "messages": request.messages,
            "tools": request.tools,
            "prompt_options": dataclasses.asdict(request.prompt_options),
            "prompt_token_ids": request.prompt_token_ids,
            "params": dataclasses.asdict(request.params),
        }
        canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def get(self, request: GenerationRequest) -> FinishEvent | None:
        """The cached result for this request (marked cached, with its id), or None."""
        key = self.key(request)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and self._clock() - entry[0] > self.config.ttl_s:
                del self._entries[key]
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return dataclasses.replace(entry[1], request_id=request.id, cached=True, ttft_s=0.0, e2e_s=0.0)

    def put(self, request: GenerationRequest, result: FinishEvent) -> None:
        """Remember a finished result (results served by the fallback are not cached)."""
        if result.fallback_used:
            return
        key = self.key(request)
        with self._lock:
            self._entries[key] = (self._clock(), result)
            self._entries.move_to_end(key)
            while len(self._entries) > self.config.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def replay(hit: FinishEvent) -> tuple[TokenEvent, FinishEvent]:
    """A cached answer as the events a fresh one sends: all its tokens in one event (marked cached), then the end."""
    tokens = TokenEvent(
        hit.request_id,
        hit.token_ids,
        hit.text,
        hit.logprobs,
        time.monotonic(),
        cached=True,
        top_logprobs=hit.top_logprobs,
        tokens=hit.tokens,
    )
    return tokens, hit

"""`Engine.enqueue` for an engine whose core is a coroutine (`submit`): its events relayed to a sink.

The reference engine takes a sink directly (its loop thread calls it). An endpoint engine, and a test's fake,
stream from `submit` on an event loop: this relay runs that loop in a thread of its own, so `enqueue` can be
called from any thread (the primary's loop thread handing a request to its fallback, a gate's burst).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from servegate.contracts.errors import ServingError
from servegate.runtime.types import ErrorEvent, Event, GenerationRequest, Sink

T = TypeVar("T")
Submit = Callable[[GenerationRequest], AsyncIterator[Event]]


class SinkRelay:
    """An event loop in a daemon thread that streams requests from `submit` and hands each event to a sink."""

    def __init__(self, name: str = "servegate-relay") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def enqueue(self, submit: Submit, request: GenerationRequest, sink: Sink) -> None:
        """Stream `request` from `submit` on the relay's loop; every event reaches `sink`, the last a Result."""
        asyncio.run_coroutine_threadsafe(_consume(submit, request, sink), self._event_loop())

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The relay's running loop (None before the first enqueue and after stop)."""
        return self._loop

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """`await make()` on the relay's loop, from another thread (the loop starts if it has not)."""

        async def go() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(go(), self._event_loop()).result()

    def stop(self) -> None:
        """Stop the loop (requests still on it end with it); a later enqueue starts a new one."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True).start()
            return self._loop


async def _consume(submit: Submit, request: GenerationRequest, sink: Sink) -> None:
    try:
        async for event in submit(request):
            sink(event)
    except ServingError as error:
        sink(ErrorEvent(request.id, error))
    except Exception as exc:  # an engine that breaks still ends the request with a catalogued error
        sink(ErrorEvent(request.id, ServingError("internal", incident=f"relay: {type(exc).__name__}")))

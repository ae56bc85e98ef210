"""The fallback route: a request the failure policy sends to the fallback engine is served there whole.

Which failures go there is decided in outcomes.py (`goes_to_fallback`); this module only carries them:
the fallback engine's events are relayed to the request's sink, its result marked fallback_used.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from servegate.contracts.errors import ServingError
from servegate.runtime.engine.interface import Engine, ErrorEvent, Event, FinishEvent, GenerationRequest, Sink
from servegate.runtime.failure_policy.outcomes import Trigger, goes_to_fallback


class FallbackRoute:
    """Hands requests to the fallback engine and relays its events, marking the result fallback_used."""

    def __init__(self, engine: Engine, triggers: list[Trigger]) -> None:
        self.engine = engine
        self.triggers = frozenset(triggers)
        self.uses = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def takes(self, trigger: Trigger | None, streamed: bool) -> bool:
        """Whether the policy hands this failure to the fallback (a declared trigger, nothing streamed yet)."""
        return goes_to_fallback(trigger, streamed, self.triggers)

    def forward(self, request: GenerationRequest, sink: Sink) -> None:
        """Serve `request` on the fallback engine; its events reach `sink` (its deadline restarts there)."""
        with self._lock:  # forwarded from the loop thread and from callers' threads alike
            self.uses += 1
        request = dataclasses.replace(request, arrival_time=None)

        def relay(event: Event) -> None:
            sink(dataclasses.replace(event, fallback_used=True) if isinstance(event, FinishEvent) else event)

        enqueue = getattr(self.engine, "enqueue", None)
        if enqueue is not None:  # a reference engine takes a sink directly
            enqueue(request, relay)
            return
        asyncio.run_coroutine_threadsafe(self._consume(request, relay), self._event_loop())

    async def _consume(self, request: GenerationRequest, relay: Sink) -> None:
        try:
            async for event in self.engine.submit(request):
                relay(event)
        except ServingError as error:
            relay(ErrorEvent(request.id, error))
        except Exception as exc:  # an endpoint that breaks still ends the request with a catalogued error
            relay(ErrorEvent(request.id, ServingError("internal", incident=f"fallback: {type(exc).__name__}")))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="servegate-fallback", daemon=True).start()
            return self._loop

    def start_sync(self) -> None:
        """Start the fallback engine (an endpoint engine is started on the relay loop it will run on)."""
        if hasattr(self.engine, "start_sync"):
            self.engine.start_sync()
        else:
            asyncio.run_coroutine_threadsafe(self.engine.start(), self._event_loop()).result()

    def shutdown_sync(self, grace_s: float) -> None:
        """Shut the fallback engine down and stop the relay loop."""
        if hasattr(self.engine, "shutdown_sync"):
            self.engine.shutdown_sync(grace_s)
        elif self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.engine.shutdown(grace_s), self._loop).result()
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None

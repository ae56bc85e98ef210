"""The fallback route: a request the failure policy sends to the fallback engine is served there whole.

Which failures go there is decided in failure_policy/outcomes.py (`goes_to_fallback`); this module only carries
them: the fallback engine's events are relayed to the request's sink, its result marked fallback_used. It sits
in engine/ because it holds an `Engine`, and failure_policy/ sits below engine/.
"""

from __future__ import annotations

import dataclasses
import threading

from servegate.runtime.engine.interface import Engine
from servegate.runtime.failure_policy.outcomes import Trigger, goes_to_fallback
from servegate.runtime.types import Event, FinishEvent, GenerationRequest, Sink


class FallbackRoute:
    """Hands requests to the fallback engine and relays its events, marking the result fallback_used."""

    def __init__(self, engine: Engine, triggers: list[Trigger]) -> None:
        self.engine = engine
        self.triggers = frozenset(triggers)
        self.uses = 0
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

        self.engine.enqueue(request, relay)

    def start_sync(self) -> None:
        """Start the fallback engine."""
        self.engine.start_sync()

    def shutdown_sync(self, grace_s: float) -> None:
        """Shut the fallback engine down."""
        self.engine.shutdown_sync(grace_s)

"""One request's events on their way to its sink: in order, from any thread, nothing after the last one.

The engine calls sinks outside its lock, so two threads may try to end the same request at once: the loop
thread finishing it while shutdown fails it, or a deadline passing as its last token streams. The first to
end it wins; a token or an end that comes later is dropped, so the caller still sees exactly one final event.
With a step trace, the moments the first token and the final event are handed to the sink are recorded, so a
replay can take each request's measured way from the engine out to the client (capacity/latency/replay.py).
"""

from __future__ import annotations

import threading
import time

from servegate.runtime.engine.step_trace import StepTrace
from servegate.runtime.types import Result, Sink, TokenEvent


class EventDelivery:
    """Delivers one request's TokenEvents and its one final event to `sink`."""

    def __init__(self, sink: Sink, trace: StepTrace | None = None, request_id: str = "") -> None:
        """`sink`: the caller's; it is called with this request's own lock held, so it must not block.
        `trace`: records when the first token and the final event of request `request_id` go to the sink."""
        self.sink = sink
        self.trace = trace
        self.request_id = request_id
        self._lock = threading.Lock()
        self._streamed = False
        self._ended = False

    @property
    def streamed(self) -> bool:
        """Whether a TokenEvent went out (a request that streamed cannot switch to the fallback)."""
        return self._streamed

    def token(self, event: TokenEvent) -> None:
        """Send a TokenEvent, unless the request has ended."""
        with self._lock:
            if not self._ended:
                if self.trace is not None and not self._streamed:  # perf_counter, the clock steps are traced on
                    self.trace.handoff(self.request_id, "first_token", time.perf_counter())
                self.sink(event)
                self._streamed = True

    def finish(self, event: Result) -> bool:
        """Send the final event; False (nothing sent) when the request had already ended."""
        with self._lock:
            if self._ended:
                return False
            self._ended = True
            self.send_last(event)
            return True

    def send_last(self, event: Result) -> None:
        """Hand the final event to the sink (after `close`, or from `finish`), recording when in the trace."""
        if self.trace is not None:
            self.trace.handoff(self.request_id, "finished", time.perf_counter())
        self.sink(event)

    def close(self) -> bool | None:
        """End the request without sending anything yet: None if it had already ended, else whether it streamed.

        The caller then owns the request's last word: it calls `sink` itself (an error, or the fallback's
        relay); no token can slip in after it.
        """
        with self._lock:
            if self._ended:
                return None
            self._ended = True
            return self._streamed

"""How a request inside the reference engine ends: its result, or its failure as the failure policy says.

Both run outside the engine lock: a request is first taken out of the table under the lock (so the
scheduler frees its blocks at once), then its final event is built and delivered here.
"""

from __future__ import annotations

from collections.abc import Iterable

from servegate.runtime.engine.fallback_route import FallbackRoute
from servegate.runtime.engine.parts import EngineParts
from servegate.runtime.engine.request_state import RequestState
from servegate.runtime.engine.request_table import Failure, RequestTable
from servegate.runtime.types import ErrorEvent, FinishEvent


def deliver_failures(failures: Iterable[Failure], route: FallbackRoute | None) -> None:
    """Each failed request's error, or its hand-over to the fallback where the failure policy says so."""
    for failure in failures:
        state = failure.state
        streamed = state.delivery.close()
        if streamed is None:  # it had ended already
            continue
        if route is not None and route.takes(failure.trigger, streamed):
            route.forward(state.request, state.delivery.sink)
        else:
            state.delivery.send_last(ErrorEvent(state.request.id, failure.error))


def finish_requests(states: list[RequestState], now: float, parts: EngineParts, table: RequestTable) -> None:
    """End requests whose output is complete: the result (or invalid_output), cached when it is a result."""
    if not states:
        return
    results = [state.finish_event(now, parts.validator) for state in states]
    with table.lock:
        released = [table.release(state) for state in states]
        table.completed += sum(released)
    for state, result, still_ours in zip(states, results, released, strict=True):
        if not still_ours:  # failed meanwhile (shutdown): that error was its last word
            continue
        if isinstance(result, FinishEvent) and parts.response_cache is not None:
            parts.response_cache.put(state.request, result)
        state.delivery.finish(result)

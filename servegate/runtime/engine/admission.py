"""How a request gets into the reference engine: the response cache, the contract, its deadline, the queue bound.

The request is encoded outside the engine lock (tokenizing is the slow part); only the decision against
the queue, taken by the failure policy (failure_policy/outcomes.py), and the registration hold the lock.
"""

from __future__ import annotations

import time

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.endings import deliver_failures
from servegate.runtime.engine.fallback_route import FallbackRoute
from servegate.runtime.engine.parts import EngineParts
from servegate.runtime.engine.request_state import RequestState, new_request_state
from servegate.runtime.engine.request_table import Failure, RequestTable
from servegate.runtime.engine.step_trace import StepTrace
from servegate.runtime.failure_policy.outcomes import (
    deadline_exceeded,
    on_arrival,
    overloaded,
    past_deadline,
    unavailable,
)
from servegate.runtime.response_cache import replay
from servegate.runtime.types import ErrorEvent, GenerationRequest, Sink


class Admission:
    """Takes requests into a started reference engine, or answers them at once."""

    def __init__(
        self,
        served: ServedModel,
        parts: EngineParts,
        table: RequestTable,
        route: FallbackRoute | None,
        trace: StepTrace | None = None,
    ) -> None:
        """`trace`: the step trace that also records when each request was admitted or refused."""
        self.served = served
        self.parts = parts
        self.table = table
        self.route = route
        self.trace = trace

    def enqueue(self, request: GenerationRequest, sink: Sink) -> int | None:
        """Accept a request whose events go to `sink`; its sequence id, or None when it ended at once."""
        cache = self.parts.response_cache
        hit = cache.get(request) if cache is not None else None
        if hit is not None:
            for event in replay(hit):
                sink(event)
            return None
        try:
            state = new_request_state(self.served, self.parts, request, sink, self.table.new_seq_id(), self.trace)
        except ServingError as error:
            sink(ErrorEvent(request.id, error))
            return None
        failures: list[Failure] = []
        with self.table.lock:
            admitted = self._admit(state, failures)
        deliver_failures(failures, self.route)
        return state.seq.seq_id if admitted else None

    def _admit(self, state: RequestState, failures: list[Failure]) -> bool:
        """Register the request unless it is late, the engine stopped or the queue is full (lock held)."""
        table, policy = self.table, self.served.failure_policy
        assert table.scheduler is not None
        if not table.accepting:
            failures.append(Failure(state, unavailable("the engine is not running"), None))
            return False
        if past_deadline(time.monotonic(), state.deadline):
            failures.append(Failure(state, deadline_exceeded(state.timeout_s), "timeout"))
            return False
        arrival = on_arrival(policy, table.scheduler.num_queued(), table.scheduler.oldest_queued)
        if self.trace is not None:  # perf_counter, the clock the steps are traced on (under the lock: in order)
            self.trace.admission(state.request.id, time.perf_counter(), arrival.admitted)
        if not arrival.admitted:
            failures.append(Failure(state, overloaded(policy), "overload"))
            return False
        if arrival.shed is not None:
            victim = table.requests[arrival.shed.seq_id]
            table.release(victim)
            failures.append(Failure(victim, overloaded(policy), "overload"))
        table.add(state)
        return True

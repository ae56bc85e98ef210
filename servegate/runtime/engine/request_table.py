"""The requests inside a reference engine, and the one lock that guards them together with its scheduler.

Threads: callers (an asyncio server, `generate`, `gate run`) add requests from their own threads; the loop
thread runs the steps. Whoever changes the table or the scheduler holds `lock`; nobody holds it while the
model runs, while tokens are sampled or detokenized, or while events go to their sinks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from servegate.contracts.errors import ServingError
from servegate.runtime.engine.request_state import RequestState
from servegate.runtime.failure_policy.outcomes import Trigger
from servegate.runtime.scheduling import Scheduler


@dataclass(frozen=True)
class Failure:
    """A request taken out of the engine under its lock, whose failure is delivered once the lock is released."""

    state: RequestState
    error: ServingError
    trigger: Trigger | None
    """The failure policy's trigger it counts as (None: never rerouted, e.g. at shutdown)."""


class RequestTable:
    """Accepted requests by sequence id, the engine's counters, and the lock (a Condition) over both."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        """Guards this table and `scheduler`; notified on every arrival, abort and ending."""
        self.scheduler: Scheduler | None = None
        """The batching mode's scheduler, once the engine has started (None for task: embed)."""
        self.requests: dict[int, RequestState] = {}
        self.accepting = False
        """Whether new requests are taken (from start until shutdown begins)."""
        self.closed = False
        """Set once shutdown has failed what was left: the loop thread ends."""
        self.news = 0
        """Counts arrivals and aborts, so the loop never sleeps through one that came during a step."""
        self.arrivals = 0
        """Requests accepted so far (a step trace records how many arrived while each step ran)."""
        self.completed = 0
        """Requests answered so far (a step trace records how many each step finished)."""
        self._next_seq_id = 0

    def new_seq_id(self) -> int:
        """A sequence id no other request of this engine has (takes the lock)."""
        with self.lock:
            seq_id = self._next_seq_id
            self._next_seq_id += 1
            return seq_id

    def add(self, state: RequestState) -> None:
        """Register an admitted request and queue its sequence (lock held)."""
        assert self.scheduler is not None
        self.requests[state.seq.seq_id] = state
        self.scheduler.add(state.seq)
        self.news += 1
        self.arrivals += 1
        self.lock.notify_all()

    def release(self, state: RequestState) -> bool:
        """Take a request out, its sequence out of the scheduler and its KV blocks back (lock held).

        False when it was out already (another thread ended it first).
        """
        if self.scheduler is not None:
            self.scheduler.finish(state.seq)
        self.lock.notify_all()
        return self.requests.pop(state.seq.seq_id, None) is not None

    def abort(self, seq_id: int) -> None:
        """The caller stopped listening: the loop drops the request at the next step boundary (takes the lock)."""
        with self.lock:
            state = self.requests.get(seq_id)
            if state is not None:
                state.aborted = True
                self.news += 1
                self.lock.notify_all()

"""What the failure policy decides for a request: overload at arrival, a passed deadline, error or fallback.

Every place that applies the policy asks here and decides nothing of its own: the reference engine
(engine/admission.py, engine/loop.py), the endpoint engine and its bounded queue (remote/endpoint.py,
contract_layer.py), the HTTP server's safety deadline (server/generation.py) and the capacity simulator
(capacity/latency/simulate.py). So an overload or a timeout means the same thing on every backend and in a plan.

Every request ends in exactly one FinishEvent or ErrorEvent. When a declared trigger fires (overload,
timeout, error) and the request has streamed nothing yet, it is handed to the fallback engine whole;
once tokens have been streamed a switch of model would mix two outputs, so the catalogued error is
returned instead.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from servegate.contracts.errors import ServingError
from servegate.contracts.failure_section import FailurePolicy
from servegate.contracts.manifest import ServedModel

Trigger = Literal["overload", "timeout", "error"]
"""The failures `failure_policy.fallback.triggers` may route to the fallback engine."""

SAFETY_SLACK_S = 0.25
"""How much later than the engine's deadline the HTTP server's own timer fires: the engine enforces the
deadline itself and says why, so its more precise error wins whenever it has one."""

_TRIGGER_OF: dict[str, Trigger] = {
    "overloaded": "overload",
    "deadline_exceeded": "timeout",
    "model_unavailable": "error",
    "internal": "error",
}
"""Which trigger a catalogued error is (other errors are the client's own and go back to it)."""

W = TypeVar("W")


class QueueBound(Protocol):
    """A bounded queue's limits: `failure_policy` itself, or the simulator's copy of them."""

    @property
    def max_queue(self) -> int:
        """Most requests waiting; beyond it the overload policy applies."""

    @property
    def overload(self) -> str:
        """`reject` (the newcomer) or `shed-oldest` (the longest waiter)."""


@dataclass(frozen=True)
class Arrival(Generic[W]):
    """What a new request meets at a bounded queue."""

    admitted: bool
    """Whether it joins the queue (else it fails with `overloaded`)."""
    shed: W | None = None
    """The oldest waiter it displaces under `shed-oldest` (that one fails with `overloaded`)."""


def on_arrival(bound: QueueBound, queued: int, oldest: Callable[[], W | None]) -> Arrival[W]:
    """Admit a new request at a queue of `queued` waiters, shed the oldest (`oldest()`) to make room, or refuse it."""
    if queued < bound.max_queue:
        return Arrival(True)
    victim = oldest() if bound.overload == "shed-oldest" else None
    return Arrival(victim is not None, victim)


def timeout_of(policy: FailurePolicy, requested_s: float | None = None) -> float:
    """Seconds a request may take from its arrival: its own timeout, else `request_timeout_s`."""
    return requested_s if requested_s is not None else policy.request_timeout_s


def past_deadline(now: float, deadline: float) -> bool:
    """Whether a request with this deadline (time.monotonic()) fails with deadline_exceeded at `now`."""
    return now >= deadline


def gateway_deadline(policy: FailurePolicy, arrival: float) -> float:
    """When the HTTP server stops waiting on the engine: the declared deadline plus SAFETY_SLACK_S."""
    return arrival + policy.request_timeout_s + SAFETY_SLACK_S


def trigger_of(error: ServingError) -> Trigger | None:
    """The fallback trigger a failure counts as (None: the client's own error, never rerouted)."""
    return _TRIGGER_OF.get(error.code)


def goes_to_fallback(trigger: Trigger | None, streamed: bool, declared: Collection[Trigger]) -> bool:
    """Whether a failure is handed to the fallback engine: a declared trigger, and nothing streamed yet."""
    return trigger is not None and trigger in declared and not streamed


def overloaded(policy: FailurePolicy) -> ServingError:
    """The `overloaded` error with the policy's status and Retry-After."""
    return ServingError(
        "overloaded",
        status=policy.overload_status,
        retry_after_s=policy.retry_after_s,
        retry_after=policy.retry_after_s,
    )


def deadline_exceeded(timeout_s: float) -> ServingError:
    """The `deadline_exceeded` error (504) naming the deadline."""
    return ServingError("deadline_exceeded", timeout_s=round(timeout_s, 3))


def unavailable(detail: str) -> ServingError:
    """The `model_unavailable` error (503)."""
    return ServingError("model_unavailable", detail=detail)


def feed_window(served: ServedModel) -> int:
    """How many requests a file-like caller keeps in flight: enough to fill batches, never past max_queue."""
    return max(1, min(served.failure_policy.max_queue, max(4, 2 * served.batching.max_batch_size)))

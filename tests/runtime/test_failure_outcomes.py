"""The failure policy's decisions (failure_policy/outcomes.py) and the one-final-event delivery the engine relies on."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from runtime_factories import create_sequences, token_requests, toy_engine

from servegate.contracts.errors import ServingError
from servegate.runtime.engine.delivery import EventDelivery
from servegate.runtime.failure_policy.outcomes import (
    gateway_deadline,
    goes_to_fallback,
    on_arrival,
    past_deadline,
    timeout_of,
    trigger_of,
)
from servegate.runtime.types import ErrorEvent, FinishEvent, TokenEvent, Usage


@dataclass(frozen=True)
class Bound:
    max_queue: int
    overload: str


def test_a_full_queue_rejects_the_newcomer_or_sheds_the_oldest_as_declared() -> None:
    assert on_arrival(Bound(2, "reject"), 1, lambda: "old").admitted
    refused = on_arrival(Bound(2, "reject"), 2, lambda: "old")
    assert not refused.admitted and refused.shed is None
    shed = on_arrival(Bound(2, "shed-oldest"), 2, lambda: "old")
    assert shed.admitted and shed.shed == "old"
    # nobody left to shed (every waiter already started): the newcomer is refused after all
    assert not on_arrival(Bound(2, "shed-oldest"), 2, lambda: None).admitted


def test_the_oldest_waiter_is_looked_up_only_when_the_queue_is_full() -> None:
    def oldest() -> str:
        raise AssertionError("looked up with room left")

    assert on_arrival(Bound(5, "shed-oldest"), 4, oldest).admitted


def test_deadlines_count_from_arrival_and_the_server_waits_a_little_longer() -> None:
    from servegate.contracts.failure_section import FailurePolicy

    policy = FailurePolicy(request_timeout_s=2.0)
    assert timeout_of(policy) == 2.0 and timeout_of(policy, 0.5) == 0.5
    assert past_deadline(12.0, 12.0) and not past_deadline(11.99, 12.0)
    assert gateway_deadline(policy, 10.0) > 10.0 + 2.0


def test_only_declared_triggers_before_any_token_go_to_the_fallback() -> None:
    assert trigger_of(ServingError("overloaded")) == "overload"
    assert trigger_of(ServingError("deadline_exceeded", timeout_s=1.0)) == "timeout"
    assert trigger_of(ServingError("model_unavailable", detail="down")) == "error"
    assert trigger_of(ServingError("invalid_request", detail="bad")) is None  # the client's own error
    assert goes_to_fallback("timeout", False, {"timeout"})
    assert not goes_to_fallback("timeout", True, {"timeout"})  # tokens went out: no switch of model
    assert not goes_to_fallback("overload", False, {"timeout"})
    assert not goes_to_fallback(None, False, {"timeout", "overload", "error"})


def test_a_request_gets_nothing_after_its_final_event() -> None:
    events: list[object] = []
    delivery = EventDelivery(events.append)
    delivery.token(TokenEvent("r", (1,), "a"))
    assert delivery.close() is True  # it streamed: the caller owns the last word now
    delivery.token(TokenEvent("r", (2,), "b"))
    assert not delivery.finish(FinishEvent("r", "ab", (1, 2), "length", Usage(1, 2)))
    assert delivery.close() is None
    delivery.sink(ErrorEvent("r", ServingError("model_unavailable", detail="shutting down")))
    assert [type(e).__name__ for e in events] == ["TokenEvent", "ErrorEvent"]


def test_sinks_run_outside_the_engine_lock() -> None:
    """A sink that waits on another thread which needs the engine lock would hang if called under it."""
    engine = toy_engine()
    took_lock: list[bool] = []

    def sink(event: object) -> None:
        if isinstance(event, TokenEvent) and not took_lock:
            other = threading.Thread(target=engine.stats)
            other.start()
            other.join(timeout=5.0)
            took_lock.append(not other.is_alive())

    done = threading.Event()
    [request] = token_requests(create_sequences(1, prompt_lens=(4, 4), max_tokens=(3, 3), seed=5))
    try:
        engine.enqueue(request, lambda e: (sink(e), done.set() if isinstance(e, FinishEvent) else None))
        assert done.wait(10.0)
    finally:
        engine.shutdown_sync()
    assert took_lock == [True]

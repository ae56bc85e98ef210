"""Failure policy on the reference engine: deadlines, a bounded queue (reject / shed-oldest), fallback."""

from __future__ import annotations

import asyncio
import threading
import time

from runtime_factories import GatedRunner, ToyPreprocessor, ToyTokenizer, toy_engine, toy_manifest, toy_sampler

from servegate.runtime.engine.reference import ReferenceEngine
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams


def request(rid: str, max_tokens: int = 4, **kw: object) -> GenerationRequest:
    return GenerationRequest(
        rid, prompt_token_ids=[5, 6, 7], params=SamplingParams(max_tokens=max_tokens, ignore_eos=True), **kw
    )


class Results:
    """Collects every event per request id from the engine's sink API."""

    def __init__(self) -> None:
        self.events: dict[str, list[object]] = {}
        self.done = threading.Condition()

    def sink(self, rid: str):
        self.events[rid] = []

        def receive(event: object) -> None:
            with self.done:
                self.events[rid].append(event)
                self.done.notify_all()

        return receive

    def final(self, rid: str) -> object:
        finals = [e for e in self.events[rid] if isinstance(e, (FinishEvent, ErrorEvent))]
        assert len(finals) == 1, f"{rid} ended {len(finals)} times"
        return finals[0]

    def wait_all(self, timeout: float = 10.0, only: str | None = None) -> None:
        end = time.monotonic() + timeout
        watched = [self.events[only]] if only else self.events.values()
        with self.done:
            while not all(any(isinstance(e, (FinishEvent, ErrorEvent)) for e in ev) for ev in watched):
                assert time.monotonic() < end, "requests did not finish"
                self.done.wait(0.05)


def held_engine(**failure_policy: object) -> tuple[ReferenceEngine, GatedRunner]:
    """An engine running one sequence at a time whose model is held shut until runner.gate.set()."""
    runner = GatedRunner(256, 4)
    served = toy_manifest(batching={"max_batch_size": 1}, failure_policy=failure_policy)
    engine = toy_engine(served, runner=runner)
    return engine, runner


def occupy(engine: ReferenceEngine, runner: GatedRunner, results: Results) -> None:
    """Start one request and hold it inside the model, so later ones queue."""
    runner.gate.clear()
    runner.entered.clear()
    engine.enqueue(request("busy"), results.sink("busy"))
    assert runner.entered.wait(10)


def test_a_request_past_its_deadline_gets_deadline_exceeded() -> None:
    engine, runner = held_engine(request_timeout_s=0.2)
    results = Results()
    occupy(engine, runner, results)
    engine.enqueue(request("late"), results.sink("late"))
    time.sleep(0.4)
    runner.gate.set()
    results.wait_all()
    engine.shutdown_sync()
    late = results.final("late")
    assert isinstance(late, ErrorEvent) and late.error.code == "deadline_exceeded"
    assert late.error.status == 504 and "0.2 s" in late.error.message
    assert isinstance(results.final("busy"), ErrorEvent)  # it was running past its deadline too


def test_a_running_request_is_stopped_at_its_deadline_with_what_it_streamed() -> None:
    engine, runner = held_engine()
    runner.delay_s = 0.05
    results = Results()
    engine.enqueue(request("slow", max_tokens=64, timeout_s=0.3), results.sink("slow"))
    results.wait_all()
    engine.shutdown_sync()
    tokens = [e for e in results.events["slow"] if not isinstance(e, (FinishEvent, ErrorEvent))]
    assert 0 < len(tokens) < 64
    assert results.final("slow").error.code == "deadline_exceeded"
    assert engine.stats().kv_blocks_used == 0


def test_a_full_queue_rejects_the_newest_with_retry_after() -> None:
    engine, runner = held_engine(max_queue=2, overload="reject", overload_status=503, retry_after_s=7)
    results = Results()
    occupy(engine, runner, results)
    for rid in ("q1", "q2", "q3"):
        engine.enqueue(request(rid), results.sink(rid))
    assert engine.stats().queue_depth == 2
    runner.gate.set()
    results.wait_all()
    engine.shutdown_sync()
    rejected = results.final("q3")
    assert isinstance(rejected, ErrorEvent) and rejected.error.code == "overloaded"
    assert rejected.error.status == 503 and rejected.error.headers() == {"Retry-After": "7"}
    assert all(isinstance(results.final(r), FinishEvent) for r in ("busy", "q1", "q2"))


def test_shed_oldest_drops_the_longest_waiting_request_instead() -> None:
    engine, runner = held_engine(max_queue=2, overload="shed-oldest")
    results = Results()
    occupy(engine, runner, results)
    for rid in ("q1", "q2", "q3"):
        engine.enqueue(request(rid), results.sink(rid))
    runner.gate.set()
    results.wait_all()
    engine.shutdown_sync()
    shed = results.final("q1")
    assert isinstance(shed, ErrorEvent) and shed.error.code == "overloaded" and shed.error.status == 429
    assert all(isinstance(results.final(r), FinishEvent) for r in ("busy", "q2", "q3"))


def test_under_overload_every_request_ends_exactly_once() -> None:
    engine, runner = held_engine(max_queue=3, overload="shed-oldest")
    results = Results()
    occupy(engine, runner, results)
    for i in range(40):
        engine.enqueue(request(f"r{i}", max_tokens=2), results.sink(f"r{i}"))
    runner.gate.set()
    results.wait_all()
    engine.shutdown_sync()
    finals = [results.final(rid) for rid in results.events]
    assert sum(isinstance(f, FinishEvent) for f in finals) == 4  # busy + the 3 newest that stayed queued
    assert sum(isinstance(f, ErrorEvent) and f.error.code == "overloaded" for f in finals) == 37


def test_a_model_failure_ends_its_requests_with_internal_and_the_engine_carries_on() -> None:
    engine, runner = held_engine()
    runner.fail_next = 1
    first = engine.generate([request("boom")])[0]
    second = engine.generate([request("fine")])[0]
    engine.shutdown_sync()
    assert isinstance(first, ErrorEvent) and first.error.code == "internal" and first.error.status == 500
    assert isinstance(second, FinishEvent)


def fallback_pair(on: list[str], **failure_policy: object) -> tuple[ReferenceEngine, GatedRunner, ReferenceEngine]:
    backup = ReferenceEngine(
        toy_manifest(name="backup"),
        runner=GatedRunner(256, 4),
        tokenizer=ToyTokenizer(),
        preprocessor=ToyPreprocessor(),
        sampler=toy_sampler,
    )  # not started: the primary starts (and stops) its fallback
    runner = GatedRunner(256, 4)
    served = toy_manifest(
        batching={"max_batch_size": 1},
        failure_policy={"fallback": {"manifest": "backup.yaml", "triggers": on}, **failure_policy},
    )
    engine = toy_engine(served, runner=runner, fallback=backup)
    return engine, runner, backup


def test_overload_goes_to_the_fallback_and_is_marked() -> None:
    engine, runner, backup = fallback_pair(["overload"], max_queue=1)
    results = Results()
    occupy(engine, runner, results)
    engine.enqueue(request("q1"), results.sink("q1"))
    engine.enqueue(request("q2"), results.sink("q2"))  # the queue is full: served by the fallback
    results.wait_all(only="q2")  # while the primary is still held
    runner.gate.set()
    results.wait_all()
    engine.shutdown_sync()
    assert results.final("q2").fallback_used is True
    assert results.final("q1").fallback_used is False
    assert engine.stats().fallback_uses == 1
    assert backup.closed  # the primary started its fallback and shut it down with itself


def test_timeout_and_error_triggers_go_to_the_fallback() -> None:
    engine, runner, backup = fallback_pair(["timeout", "error"], request_timeout_s=0.2)
    results = Results()
    occupy(engine, runner, results)
    engine.enqueue(request("late"), results.sink("late"))
    time.sleep(0.4)
    runner.gate.set()
    results.wait_all()
    runner.fail_next = 1
    broken = engine.generate([request("broken")])[0]
    engine.shutdown_sync()
    assert results.final("late").fallback_used is True
    assert isinstance(broken, FinishEvent) and broken.fallback_used
    assert engine.stats().fallback_uses >= 2


def test_a_trigger_not_declared_is_answered_with_the_error() -> None:
    engine, runner, backup = fallback_pair(["timeout"], max_queue=1)
    results = Results()
    occupy(engine, runner, results)
    engine.enqueue(request("q1"), results.sink("q1"))
    engine.enqueue(request("q2"), results.sink("q2"))
    runner.gate.set()
    results.wait_all()
    engine.shutdown_sync()
    assert results.final("q2").error.code == "overloaded"


def test_a_client_that_leaves_frees_its_blocks() -> None:
    engine, runner = held_engine()

    async def leave_early() -> None:
        stream = engine.submit(request("gone", max_tokens=50))
        await anext(stream)
        await stream.aclose()

    asyncio.run(leave_early())
    end = time.monotonic() + 5
    while engine.stats().running and time.monotonic() < end:
        time.sleep(0.01)
    stats = engine.stats()
    engine.shutdown_sync()
    assert stats.running == 0 and stats.kv_blocks_used == 0


def test_shutdown_fails_what_is_left_with_model_unavailable() -> None:
    engine, runner = held_engine()
    results = Results()
    occupy(engine, runner, results)
    engine.enqueue(request("queued"), results.sink("queued"))
    threading.Timer(0.3, runner.gate.set).start()
    engine.shutdown_sync(grace_s=0.1)
    results.wait_all()
    assert results.final("queued").error.code == "model_unavailable"
    late = Results()
    engine.enqueue(request("late"), late.sink("late"))
    assert late.final("late").error.code == "model_unavailable"


def test_build_wires_the_fallback_manifest_and_the_endpoint_backend(tmp_path) -> None:
    from servegate.contracts.loading import load_manifest
    from servegate.runtime import build
    from servegate.runtime.remote.endpoint import EndpointEngine

    (tmp_path / "backup.yaml").write_text("name: backup\nweights: {source: zoo:tiny-fallback}\n")
    (tmp_path / "primary.yaml").write_text(
        "name: primary\nweights: {source: zoo:tiny-primary}\n"
        "failure_policy: {fallback: {manifest: backup.yaml, triggers: [overload, timeout]}}\n"
    )
    engine = build(load_manifest(tmp_path / "primary.yaml"))
    assert isinstance(engine, ReferenceEngine) and engine.served.name == "primary"
    route = engine.fallback_route
    assert route is not None and route.engine.served.name == "backup" and route.triggers == {"overload", "timeout"}
    alone = build(load_manifest(tmp_path / "primary.yaml"), fallback=False)
    assert alone.fallback_route is None
    (tmp_path / "remote.yaml").write_text(
        "name: remote\nweights: {source: zoo:tiny-primary}\n"
        "runtime: {backend: endpoint, endpoint_url: 'http://127.0.0.1:9/v1'}\n"
    )
    assert isinstance(build(load_manifest(tmp_path / "remote.yaml")), EndpointEngine)

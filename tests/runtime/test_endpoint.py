"""The endpoint backend: the Engine interface over an OpenAI-compatible server (a synthetic one here)."""

from __future__ import annotations

import asyncio
import time

from support.synthetic_server import Delays, SyntheticServer

from servegate.capacity.bench.local_server import free_port
from servegate.contracts.manifest import ServedModel
from servegate.runtime import build
from servegate.runtime.engine.interface import Engine
from servegate.runtime.remote.completions_stream import error_from_status
from servegate.runtime.remote.endpoint import EndpointEngine
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams, TokenEvent


def served_at(url: str, timeout_s: float = 30.0) -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "remote",
            "weights": {"source": "zoo:tiny-primary"},
            "runtime": {"backend": "endpoint", "endpoint_url": url},
            "failure_policy": {"request_timeout_s": timeout_s},
        }
    )


async def collect(engine: Engine, request: GenerationRequest) -> list:
    return [event async for event in engine.submit(request)]


def test_build_gives_an_endpoint_engine_that_streams_tokens() -> None:
    with SyntheticServer(Delays(ttft_ms=30, itl_ms=20)) as server:
        engine = build(served_at(server.url))
        assert isinstance(engine, EndpointEngine) and isinstance(engine, Engine)
        request = GenerationRequest("r1", prompt="hello", params=SamplingParams(max_tokens=4))
        events = asyncio.run(collect(engine, request))
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    [finish] = [e for e in events if isinstance(e, FinishEvent)]
    assert len(tokens) == 4 and "".join(t.text for t in tokens) == finish.text == "xxxx"
    assert finish.usage.completion_tokens == 4
    assert finish.usage.prompt_tokens == 6  # what was sent: the manifest's tokenizer (BOS + 5 characters)
    assert finish.finish_reason == "length"
    assert finish.ttft_s is not None and 0.03 <= finish.ttft_s < 0.5  # the first call also opens the pool
    assert tokens[-1].time - tokens[0].time >= 0.045  # three 20 ms gaps: each token is stamped as it arrives


def test_generate_runs_requests_concurrently_in_order() -> None:
    with SyntheticServer(Delays(ttft_ms=100, itl_ms=0)) as server:
        engine = build(served_at(server.url))
        requests = [GenerationRequest(f"r{i}", prompt="p", params=SamplingParams(max_tokens=i + 1)) for i in range(6)]
        engine.start_sync()  # tokenizer and identity first: only the requests are timed
        began = time.perf_counter()
        results = engine.generate(requests)
        elapsed = time.perf_counter() - began
    assert [r.request_id for r in results] == [f"r{i}" for i in range(6)]
    assert [len(r.text) for r in results] == [1, 2, 3, 4, 5, 6]
    assert elapsed < 0.5  # six 100 ms requests at once, not one after another


def test_deadline_and_unreachable_server_become_catalogued_errors() -> None:
    with SyntheticServer(Delays(ttft_ms=500)) as server:
        engine = build(served_at(server.url, timeout_s=0.1))
        events = asyncio.run(collect(engine, GenerationRequest("slow", prompt="p")))
    assert isinstance(events[-1], ErrorEvent) and events[-1].error.code == "deadline_exceeded"
    engine = build(served_at(f"http://127.0.0.1:{free_port()}/v1"))
    events = asyncio.run(collect(engine, GenerationRequest("down", prompt="p")))
    assert isinstance(events[-1], ErrorEvent) and events[-1].error.code == "model_unavailable"
    assert engine.stats().running == 0


def test_remote_statuses_map_to_the_catalogue() -> None:
    assert error_from_status(429, "{}").code == "overloaded"
    body = '{"error": {"code": "input_too_long", "message": "too long"}}'
    assert error_from_status(400, body).code == "input_too_long"
    assert error_from_status(400, "bad").code == "invalid_request"
    assert error_from_status(503, "down").code == "model_unavailable"

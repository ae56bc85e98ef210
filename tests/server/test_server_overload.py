"""The contract under load and faults: overload as declared, deadlines, engine crashes, draining on SIGTERM.

These need faults the real engine cannot be asked for (slow tokens, a hang, a crash), so they run on the
fake engine behind the same app and runner as `gate serve`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.manifests import fake_manifest
from support.servers import ServerProcess, start_fake_server

MODEL = "fake-model"
JSON = {"Content-Type": "application/json"}
MAX_QUEUE, RUNNING, RETRY_AFTER_S = 8, 2, 3


@pytest.fixture(scope="module")
def server(module_dir: Path) -> Iterator[ServerProcess]:
    """A small server: 2 sequences at once, 8 waiting, overload declared as 503 with Retry-After 3 s."""
    manifest = fake_manifest(
        batching={"max_batch_size": RUNNING},
        failure_policy={
            "max_queue": MAX_QUEUE,
            "overload_status": 503,
            "retry_after_s": RETRY_AFTER_S,
            "request_timeout_s": 30,
        },
    )
    process = start_fake_server(module_dir, manifest, {"token_delay_s": 0.02})
    process.wait_until("/ready", 200)
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def short_deadline_server(module_dir: Path) -> Iterator[ServerProcess]:
    """A server whose requests have 2 s to finish, and which truncates long prompts from the left."""
    folder = module_dir / "short-deadline"
    folder.mkdir()
    manifest = fake_manifest(failure_policy={"request_timeout_s": 2}, preprocess={"truncation": "left"})
    process = start_fake_server(folder, manifest)
    process.wait_until("/ready", 200)
    yield process
    assert process.stop() == 0


async def _one(client: httpx.AsyncClient, index: int) -> tuple[int, dict[str, Any] | str, httpx.Headers]:
    stream = index % 4 == 0
    body = {"model": MODEL, "prompt": f"load {index}", "max_tokens": 10, "temperature": 0, "stream": stream}
    response = await client.post("/v1/completions", json=body)
    is_sse = response.headers.get("content-type", "").startswith("text/event-stream")
    return response.status_code, (response.text if is_sse else response.json()), response.headers


def _requests_total(server: ServerProcess) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in httpx.get(server.url("/metrics")).text.splitlines():
        if line.startswith('servegate_requests_total{endpoint="completions"'):
            status = line.split('status="')[1].split('"')[0]
            counts[status] += int(float(line.rsplit(" ", 1)[1]))
    return counts


def test_overload_answers_the_declared_status_and_every_request_ends_once(server: ServerProcess) -> None:
    sent = 300
    before = _requests_total(server)

    async def burst() -> list[tuple[int, Any, httpx.Headers]]:
        limits = httpx.Limits(max_connections=sent, max_keepalive_connections=sent)
        async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=30) as client:
            return await asyncio.gather(*(_one(client, i) for i in range(sent)))

    started = time.monotonic()
    results = asyncio.run(burst())
    assert time.monotonic() - started < 60
    statuses = Counter(status for status, _, _ in results)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[503] >= sent // 2, statuses  # the queue holds 8: most of a 300-request burst is refused
    assert statuses[200] >= MAX_QUEUE, statuses
    for status, body, headers in results:
        if status == 503:
            assert body["error"]["code"] == "overloaded" and headers["Retry-After"] == str(RETRY_AFTER_S)
        elif isinstance(body, str):  # a stream that was admitted ran to its end
            assert body.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in body
        else:
            assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 10
    # The server's own count agrees: one outcome per request, nothing lost, nothing counted twice.
    after = _requests_total(server)
    assert {int(k): after[k] - before[k] for k in after if after[k] != before[k]} == dict(statuses)
    calm = httpx.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": "after", "max_tokens": 2})
    assert calm.status_code == 200 and httpx.get(server.url("/ready")).status_code == 200


def test_a_request_past_its_deadline_gets_504(short_deadline_server: ServerProcess) -> None:
    """The engine never answers: the server's own timer ends the request with deadline_exceeded."""
    started = time.monotonic()
    body = {"model": MODEL, "prompt": "HANG-THE-ENGINE", "max_tokens": 2}
    response = httpx.post(short_deadline_server.url("/v1/completions"), json=body, timeout=30)
    assert response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
    assert "2" in response.json()["error"]["message"]
    assert 1.9 < time.monotonic() - started < 10


def test_a_stream_past_its_deadline_ends_with_an_error_event(short_deadline_server: ServerProcess) -> None:
    """Tokens come every 0.5 s, the deadline is 2 s: the stream has begun, so the error is its last event."""
    body = {"model": MODEL, "prompt": "SLOW-THE-ENGINE", "max_tokens": 32, "stream": True}
    with httpx.stream("POST", short_deadline_server.url("/v1/completions"), json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["code"] == "deadline_exceeded"
    assert 1 <= len(lines) - 2 <= 5  # a few tokens made it before the deadline


def test_a_truncated_prompt_reports_the_dropped_tokens_in_usage(short_deadline_server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": "t" * 100, "max_tokens": 2}
    response = httpx.post(short_deadline_server.url("/v1/completions"), json=body)
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["truncated_tokens"] == 100 - 64 and usage["prompt_tokens"] == 64


def test_an_engine_crash_is_a_500_that_reveals_nothing(server: ServerProcess) -> None:
    secret = "CRASH-THE-ENGINE with secret 7f3a9c"
    response = httpx.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": secret, "max_tokens": 2})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal" and "7f3a9c" not in response.text
    incident = error["message"].split("id ")[1].rstrip(")")
    log = server.log()
    assert f"internal error {incident}: RuntimeError" in log and "7f3a9c" not in log
    ok = httpx.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": "fine", "max_tokens": 2})
    assert ok.status_code == 200


def test_sigterm_drains_in_flight_work_refuses_new_work_and_exits_0(tmp_path: Path) -> None:
    manifest = fake_manifest(failure_policy={"request_timeout_s": 20})
    server = start_fake_server(tmp_path, manifest, {"token_delay_s": 0.1})
    server.wait_until("/ready", 200)
    lines: list[str] = []
    first_chunk = threading.Event()

    def stream() -> None:
        body = {"model": MODEL, "prompt": "drain me", "max_tokens": 20, "stream": True}
        with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                    first_chunk.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first_chunk.wait(10)
    server.process.terminate()  # SIGTERM while the stream has ~2 s to go
    time.sleep(0.3)
    refused = httpx.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": "new", "max_tokens": 2})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_unavailable"
    assert "Retry-After" in refused.headers
    assert httpx.get(server.url("/ready")).status_code == 503
    reader.join(30)
    assert lines[-1] == "data: [DONE]"
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])
    assert len(text) == 20  # the in-flight stream finished whole
    assert server.stop() == 0
    assert "draining" in server.log()

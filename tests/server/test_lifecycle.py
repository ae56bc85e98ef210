"""Asynchronous responses, tenants from the `user` field, warm-up readiness, and `gate serve` on the command line."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fault_engine import fake_text
from support.manifests import fake_manifest, real_manifest, write_manifest
from support.servers import GATE, ServerProcess, start_fake_server, start_gate_serve

MODEL = "fake-model"
TTL_S = 1.5


@pytest.fixture(scope="module")
def server(module_dir: Path) -> Iterator[ServerProcess]:
    """Tenants from the `user` field; async results kept 1.5 s; 30 ms per token so a poll can see a request running."""
    manifest = fake_manifest(preprocess={"tenant_from": "user"}, postprocess={"async_result_ttl_s": TTL_S})
    process = start_fake_server(module_dir, manifest, {"token_delay_s": 0.03})
    process.wait_until("/ready", 200)
    yield process
    assert process.stop() == 0


def _poll(server: ServerProcess, location: str, tenant: str, timeout_s: float = 10) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = httpx.get(server.url(location), headers={"X-Tenant": tenant})
        if response.status_code != 202:
            return response
        assert response.json()["status"] == "in_progress" and "Retry-After" in response.headers
        time.sleep(0.05)
    raise AssertionError("the async request never finished")


def test_async_request_is_accepted_polled_and_forgotten_after_its_ttl(server: ServerProcess) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "later", "max_tokens": 10, "temperature": 0, "user": "alice"}
    accepted = httpx.post(server.url("/v1/completions"), json=body, headers={"Prefer": "respond-async"})
    assert accepted.status_code == 202
    location = accepted.headers["Location"]
    assert location == f"/v1/requests/{accepted.json()['id']}" and accepted.json()["status"] == "queued"
    # Another tenant cannot see it, even with the id.
    assert httpx.get(server.url(location), headers={"X-Tenant": "mallory"}).status_code == 404
    result = _poll(server, location, "alice")
    assert result.status_code == 200
    sync = httpx.post(server.url("/v1/completions"), json=body).json()
    assert result.json()["choices"][0]["text"] == sync["choices"][0]["text"]
    assert result.json()["id"] == accepted.json()["id"]
    time.sleep(TTL_S + 0.2)
    gone = httpx.get(server.url(location), headers={"X-Tenant": "alice"})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert "expired" in gone.json()["error"]["message"]


def test_async_request_keeps_its_error_as_its_result(server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": "x" * 100, "max_tokens": 2, "user": "bob"}
    accepted = httpx.post(server.url("/v1/completions"), json=body, headers={"Prefer": "respond-async"})
    assert accepted.status_code == 202
    result = _poll(server, accepted.headers["Location"], "bob")
    assert result.status_code == 400 and result.json()["error"]["code"] == "input_too_long"


def test_async_chat_request(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "user": "carol"}
    accepted = httpx.post(server.url("/v1/chat/completions"), json=body, headers={"Prefer": "respond-async"})
    result = _poll(server, accepted.headers["Location"], "carol")
    assert result.status_code == 200 and result.json()["object"] == "chat.completion"


def test_unknown_request_id_is_404(server: ServerProcess) -> None:
    response = httpx.get(server.url("/v1/requests/cmpl-nothing"), headers={"X-Tenant": "alice"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "id"


def test_tenant_from_user_requires_the_user_field(server: ServerProcess) -> None:
    response = httpx.post(server.url("/v1/completions"), json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert response.status_code == 400
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("invalid_request", "user")


# --- warm-up ----------------------------------------------------------------------------------------------


def _warmup_manifest(expect: str) -> dict[str, Any]:
    return fake_manifest(runtime={"warmup": [{"prompt": "2+2=", "expect": expect, "max_tokens": 6}]})


def test_warmup_with_the_expected_output_makes_the_server_ready(server_factory: Any) -> None:
    good = server_factory(_warmup_manifest(fake_text("2+2=", 0.0, 0, 6)))
    good.wait_until("/ready", 200)
    assert "warm-up passed: 1 prompt(s)" in good.log()


def test_warmup_mismatch_keeps_the_server_not_ready_and_says_why(tmp_path: Path, weights_source: str) -> None:
    """`gate serve` on the reference engine, with an expectation the model cannot meet: a broken deploy."""
    expected = "this is not what the model says"
    warmup = [{"prompt": "12+34=", "expect": expected, "max_tokens": 4}]
    broken = start_gate_serve(tmp_path, real_manifest(weights_source, runtime={"warmup": warmup}))
    try:
        broken.wait_until("/health", 200, timeout_s=240)
        deadline = time.monotonic() + 240
        while "warm-up prompt 1 of 1" not in broken.log():
            assert time.monotonic() < deadline and broken.process.poll() is None, broken.log()
            time.sleep(0.2)
        ready = httpx.get(broken.url("/ready"))
        assert ready.status_code == 503 and "warm-up failed" in ready.json()["reason"]
        assert ready.json()["starting"] is False  # it will not become ready by itself: no point waiting
        assert f"warm-up prompt 1 of 1: expected {expected!r}, got" in broken.log()
        refused = httpx.post(broken.url("/v1/completions"), json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_unavailable"
        assert "warm-up failed" in refused.json()["error"]["message"] and "Retry-After" in refused.headers
        assert "servegate_ready 0.0" in httpx.get(broken.url("/metrics")).text
    finally:
        assert broken.stop() == 0


# --- the command line --------------------------------------------------------------------------------------


def test_gate_serve_help_names_the_endpoints() -> None:
    result = subprocess.run([str(GATE), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for word in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "--port", "--host", "--set"):
        assert word in result.stdout


def test_gate_serve_reports_a_bad_manifest_in_one_line_and_exits_2(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, fake_manifest(batching={"max_batch_size": 0}))
    result = subprocess.run([str(GATE), "serve", str(path), "--port", "1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "batching.max_batch_size" in result.stderr and "Traceback" not in result.stderr
    bad_set = subprocess.run(
        [
            sys.executable,
            "-m",
            "servegate.cli",
            "serve",
            str(path),
            "--set",
            "batching.max_batch_size=2",
            "--log-level",
            "loud",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad_set.returncode == 2 and "--log-level" in bad_set.stderr

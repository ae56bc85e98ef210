"""Planted secrets never leave: not in the server's log (at its default level), not in /metrics, not in the
in-process log records, not in `gate check`'s JSON, JUnit and Markdown reports or console, not in the note.

Every way a client can hand the server a string is used once with the secret in it (prompt, chat message,
stop string, user, X-Tenant, model name, field names and values, over-long and malformed bodies, streams,
async requests, embeddings). The fake-engine version of the log and metrics check is in tests/server/;
the note's filter on hand-made leaky reports is in tests/model_cards/test_public_safety.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_engine import MODEL_NAME, manifest_data, model_source, reference_engine
from reliability_server import start_server
from support.manifests import write_manifest
from support.servers import ServerProcess

from servegate.contracts.manifest import ServedModel
from servegate.server import create_app
from servegate.server.app import bring_up

pytestmark = pytest.mark.reliability

SECRET = f"SECRET-{uuid.uuid4().hex[:16]}"


def secret_requests() -> list[tuple[str, str, dict[str, str], bytes]]:
    """(method, path, headers, body) of every request shape that carries the secret."""
    json_type = {"Content-Type": "application/json", "X-Tenant": "tenant-plain"}

    def post(path: str, body: Any, **headers: str) -> tuple[str, str, dict[str, str], bytes]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return "POST", path, {**json_type, **headers}, raw

    completion = {"model": MODEL_NAME, "prompt": f"tell {SECRET}", "max_tokens": 4, "temperature": 0}
    chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": SECRET}], "max_tokens": 4}
    return [
        post("/v1/completions", completion),
        post("/v1/completions", {**completion, "stream": True}),
        post("/v1/completions", completion, Prefer="respond-async"),
        post("/v1/chat/completions", chat),
        post("/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}}),
        post("/v1/completions", {**completion, "stop": [SECRET]}),
        post("/v1/completions", {**completion, "user": SECRET}),
        post("/v1/completions", completion, **{"X-Tenant": f"TENANT-{SECRET}"}),
        post("/v1/completions", {**completion, "model": SECRET}),
        post("/v1/completions", {**completion, SECRET: 1}),
        post("/v1/completions", {**completion, "max_tokens": SECRET}),
        post("/v1/completions", {**completion, "prompt": SECRET * 40}),
        post("/v1/completions", f'{{"model": "{MODEL_NAME}", "prompt": "{SECRET}'.encode()),
        post("/v1/completions", {**completion, "prompt": f"{SECRET}\x00"}),
        post("/v1/embeddings", {"model": MODEL_NAME, "input": SECRET}),
        post("/v1/completions", completion, Authorization=f"Bearer {SECRET}"),
        ("POST", "/v1/completions", {"Content-Type": "text/plain"}, SECRET.encode()),
        post("/v1/completions", {**completion, "prompt": SECRET * 400}),  # past max_payload_bytes
    ]


def send_all_sync(base_url: str) -> dict[int, int]:
    """Send every secret request (and poll the async one); statuses counted."""
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for method, path, headers, body in secret_requests():
            response = client.request(method, path, headers=headers, content=body)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code == 202:
                poll = client.get(response.headers["Location"], headers={"X-Tenant": "tenant-plain"})
                statuses[poll.status_code] = statuses.get(poll.status_code, 0) + 1
    return statuses


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`gate serve` with tenants from X-Tenant, logprobs, both caches, 4 KiB bodies, default log level."""
    folder = tmp_path_factory.mktemp("secrets")
    data = manifest_data(
        model_source(folder),
        preprocess={"tenant_from": "header", "max_payload_bytes": 4096},
        runtime={"kv_cache": {"block_size": 8, "memory_budget": "2MiB", "prefix_caching": True}},
        postprocess={"response_cache": {"enabled": True}},
    )
    process = start_server(folder / "run", data)
    process.wait_ready()
    yield process
    process.stop()


def test_server_log_and_metrics_never_show_a_planted_secret(server: ServerProcess, figures: Any) -> None:
    statuses = send_all_sync(server.base_url)
    metrics = httpx.get(server.url("/metrics"), timeout=10).text
    assert server.stop() == 0
    log = server.log()
    figures.count("requests carrying the secret", len(secret_requests()))
    figures.set("statuses", dict(sorted(statuses.items())))
    figures.count("log lines read (level info)", len(log.splitlines()))
    figures.count("secret occurrences in log + metrics", log.count(SECRET) + metrics.count(SECRET))
    assert 200 in statuses and 400 in statuses and 413 in statuses  # served, refused and oversize paths all ran
    assert "servegate_requests_total" in metrics
    assert SECRET not in log and SECRET not in metrics
    assert "TENANT-" not in log and "TENANT-" not in metrics


def test_in_process_log_records_never_show_a_planted_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, figures: Any
) -> None:
    served = ServedModel.model_validate(manifest_data(model_source(tmp_path), preprocess={"tenant_from": "header"}))

    async def run() -> dict[int, int]:
        app = create_app(served, reference_engine(served))
        await bring_up(app.state.serving)
        statuses: dict[int, int] = {}
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://servegate", timeout=60) as client:
                for method, path, headers, body in secret_requests():
                    response = await client.request(method, path, headers=headers, content=body)
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        finally:
            await app.state.serving.engine.shutdown(5)
        return statuses

    caplog.set_level(logging.INFO)
    for name in ("servegate", "servegate.server", "servegate.runtime", "uvicorn", "httpx"):
        logging.getLogger(name).propagate = True
    statuses = asyncio.run(run())
    text = "\n".join(f"{r.name}: {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    figures.count("log records captured (level info)", len(caplog.records))
    figures.count("secret occurrences", text.count(SECRET))
    assert 200 in statuses
    assert SECRET not in text


def _gate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run `gate ARGS` in process; (exit code, stdout + stderr)."""
    from servegate.cli.app import main

    monkeypatch.setattr(sys, "argv", ["gate", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out + err


def test_reports_and_note_never_show_a_private_suites_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], figures: Any
) -> None:
    rows = [{"id": f"p-{i}", "prompt": f"{SECRET} ticket {i}: {10 + i}+{20 + i}=", "reference": f"{SECRET}-{i}"}
            for i in range(12)]  # fmt: skip
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    data = manifest_data(
        model_source(tmp_path),
        preprocess={"tenant_from": "header", "truncation": "left", "max_input_tokens": 24},
        runtime={"quantization": {"method": "int2-weight"},
                 "kv_cache": {"block_size": 8, "memory_budget": "2MiB", "prefix_caching": True}},
        postprocess={"response_cache": {"enabled": True}},
        quality={"suites": [{"name": "arith", "dataset": "zoo:arith", "limit": 12, "public": True},
                            {"name": "held", "dataset": "held.jsonl", "public": False}]},
        capacity={"workload": {"input_tokens": {"mean": 20, "max": 24}, "output_tokens": {"mean": 8, "max": 16},
                               "rate_rps": 2},
                  "targets": {"e2e_ms": {"p99": 5000}}},
        card={"public_name": "reliability/tiny", "intended_use": "tests", "license": "Apache-2.0"},
    )  # fmt: skip
    manifest = write_manifest(tmp_path, data, "manifest.json")
    out = tmp_path / "out"
    monkeypatch.setenv("SERVEGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    check_code, check_console = _gate(
        monkeypatch, capsys, "check", str(manifest), "--json", str(out / "check.json"), "--junit",
        str(out / "check.xml"), "--markdown", str(out / "check.md"), "--gate", "quantization", "--gate", "truncation",
        "--gate", "caching", "--gate", "quality",
    )  # fmt: skip
    note_code, note_console = _gate(
        monkeypatch, capsys, "note", str(manifest), "--report", str(out / "check.json"), "-o", str(out / "SERVING.md")
    )
    written = {p.name: p.read_text(encoding="utf-8") for p in sorted(out.iterdir()) if p.is_file()}
    report = json.loads(written["check.json"])
    verdicts = ", ".join(f"{g['name']}: {g['verdict']}" for g in report["gates"] if g["verdict"] != "skipped")
    figures.set("gate check exit / verdicts", f"{check_code} / {verdicts}")
    figures.set("gate note exit", note_code)
    figures.set("files checked", sorted(written) + ["console output"])
    leaks = {name for name, text in {**written, "console": check_console + note_console}.items() if SECRET in text}
    figures.count("files (or console) showing the secret", len(leaks))
    assert check_code in (0, 1), check_console[-2000:]
    assert note_code == 0, note_console[-2000:]
    assert {"check.json", "check.xml", "check.md", "SERVING.md"} <= set(written)
    assert '"held"' in written["check.json"]  # the private suite was evaluated and reported by name
    assert not leaks, leaks

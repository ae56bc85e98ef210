"""A small OpenAI-compatible endpoint that answers like vLLM 0.32 would, with knobs to make it drift.

Runs on 127.0.0.1 on a free port in a daemon thread (http.server), for as long as the `with` block lasts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class EngineState:
    """What the fake deployment reports; defaults match tests/deploy's verify manifest."""

    model_id: str = "verify-me"
    max_model_len: int = 128
    version: str = "0.32.0"
    cache: dict[str, str] = field(
        default_factory=lambda: {
            "block_size": "16",
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "num_gpu_blocks": "2730",
            "kv_cache_memory_bytes": str(64 * 2**20),
        }
    )
    completions: dict[str, str] = field(default_factory=lambda: {"12+34=": "46"})
    long_prompt_status: int = 400
    unknown_field_status: int = 400
    harmless_field_status: int = 400
    """The answer to a field on servegate's harmless list (`metadata`): 400 under reject, 200 under ignore."""
    long_prompt_chars: int = 128
    ready_fingerprint: str | None = None
    """Answer /ready with this fingerprint, as servegate's gateway does (None: no /ready, as vLLM)."""


def _handler(state: EngineState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output quiet
            return

        def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/v1/models":
                card = {"id": state.model_id, "object": "model", "max_model_len": state.max_model_len}
                self._send(200, {"object": "list", "data": [card]})
            elif self.path == "/ready" and state.ready_fingerprint is not None:
                self._send(200, {"status": "ready", "model": state.model_id, "fingerprint": state.ready_fingerprint})
            elif self.path == "/version":
                self._send(200, {"version": state.version})
            elif self.path == "/metrics":
                labels = ",".join(f'{k}="{v}"' for k, v in sorted({**state.cache, "engine": "0"}.items()))
                text = (
                    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
                    "# TYPE vllm:cache_config_info gauge\n"
                    f"vllm:cache_config_info{{{labels}}} 1.0\n"
                )
                self._send(200, text, "text/plain; version=0.0.4")
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("content-length", "0"))
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "bad json"}})
                return
            if self.path != "/v1/completions":
                self._send(404, {"error": {"message": "not found"}})
            elif "servegate_probe_unknown_field" in body and state.unknown_field_status != 200:
                self._send(state.unknown_field_status, {"error": {"message": "unknown field"}})
            elif "metadata" in body and state.harmless_field_status != 200:
                self._send(state.harmless_field_status, {"error": {"message": "unknown field"}})
            elif len(str(body.get("prompt", ""))) > state.long_prompt_chars and state.long_prompt_status != 200:
                self._send(state.long_prompt_status, {"error": {"message": "prompt too long"}})
            else:
                text = state.completions.get(str(body.get("prompt")), "0")
                self._send(200, {"object": "text_completion", "choices": [{"index": 0, "text": text}]})

    return Handler


@contextmanager
def fake_engine(state: EngineState) -> Iterator[str]:
    """Serve `state` on 127.0.0.1; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

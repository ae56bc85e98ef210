"""A fake OpenAI-compatible remote engine for endpoint-backend tests, served by uvicorn in a thread.

It identifies itself like vLLM or servegate (`/version`, `/v1/models`, `/metrics`), streams completions
with usage and logprobs, and records every request body it got, so tests can see exactly what servegate
sent (token ids after truncation, stop strings, cache salt). `answer` decides the text: by default the
reference engine's own greedy output for the prompt ids (a remote that serves the same model), or any
function of the prompt ids (a remote that answers differently).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from servegate.capacity.bench.local_server import free_port

Answer = Callable[[list[int], int], str]
"""(prompt token ids, max_tokens) -> the completion text."""


@dataclass
class RemoteBehaviour:
    """How the fake remote behaves."""

    engine: str = "vllm"
    version: str = "0.32.0"
    model: str = "remote"
    max_model_len: int | None = 256
    delay_s: float = 0.0
    """Seconds before the first chunk of every completion."""
    status: int = 200
    """Answer every completion with this status (e.g. 500) instead of a stream."""
    resident_bytes: int = 300 * 2**20
    """process_resident_memory_bytes in /metrics."""
    answer: Answer | None = None
    """None: each token id of the prompt's last token, as text 'x' (set by a test to anything)."""


@dataclass
class FakeRemote:
    """`with FakeRemote(behaviour) as remote: remote.url`; `remote.bodies` holds the completion bodies received."""

    behaviour: RemoteBehaviour = field(default_factory=RemoteBehaviour)
    port: int = field(default_factory=free_port)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight_max: int = 0
    _in_flight: int = 0
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API base URL (…/v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> FastAPI:
        """The FastAPI app of this remote."""
        app = FastAPI()
        b = self.behaviour

        @app.get("/version")
        async def version() -> dict[str, str]:
            return {"engine": b.engine, "version": b.version} if b.engine != "vllm" else {"version": b.version}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            card: dict[str, Any] = {"id": b.model, "object": "model", "owned_by": b.engine}
            if b.max_model_len is not None:
                card["max_model_len"] = b.max_model_len
            return {"object": "list", "data": [card]}

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            text = f"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {b.resident_bytes}.0\n"
            return PlainTextResponse(text)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            if b.status != 200:
                return JSONResponse({"error": {"message": "broken", "code": b.status}}, status_code=b.status)
            ids = body["prompt"] if isinstance(body["prompt"], list) else [1]
            text = await asyncio.to_thread(self._answer, ids, int(body.get("max_tokens", 16)))
            return StreamingResponse(self._stream(body, text), media_type="text/event-stream")

        return app

    def _answer(self, ids: list[int], max_tokens: int) -> str:
        answer = self.behaviour.answer
        return answer(ids, max_tokens) if answer is not None else "x" * max_tokens

    async def _stream(self, body: dict[str, Any], text: str) -> Any:
        self._in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self._in_flight)
        try:
            if self.behaviour.delay_s:
                await asyncio.sleep(self.behaviour.delay_s)
            want = body.get("logprobs")
            for i, char in enumerate(text):
                choice: dict[str, Any] = {"index": 0, "text": char, "finish_reason": None}
                if want:
                    choice["logprobs"] = {"tokens": [char], "token_logprobs": [-0.5 - i / 100],
                                          "top_logprobs": [{char: -0.5 - i / 100}]}  # fmt: skip
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            end = {"index": 0, "text": "", "finish_reason": "length", "stop_reason": None}
            yield f"data: {json.dumps({'choices': [end]})}\n\n"
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(text)}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self._in_flight -= 1

    def __enter__(self) -> FakeRemote:
        config = uvicorn.Config(self.app(), host="127.0.0.1", port=self.port, log_level="error", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        end = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > end:
                raise RuntimeError("the fake remote did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)


def reference_answer(manifest: dict[str, Any]) -> Answer:
    """The reference engine's greedy text for the prompt ids: a remote that serves the same model."""
    from servegate.contracts.manifest import ServedModel
    from servegate.runtime import build
    from servegate.runtime.engine.interface import FinishEvent, GenerationRequest, SamplingParams

    engine = build(ServedModel.model_validate(manifest), fallback=False)
    lock = threading.Lock()

    def answer(ids: list[int], max_tokens: int) -> str:
        params = SamplingParams(max_tokens=max_tokens)
        with lock:
            [result] = engine.generate([GenerationRequest("remote", prompt_token_ids=ids, params=params)])
        return result.text if isinstance(result, FinishEvent) else ""

    return answer

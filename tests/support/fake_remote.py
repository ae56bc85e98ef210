"""A fake OpenAI-compatible remote engine for endpoint-backend tests, served by uvicorn in a thread.

It identifies itself like vLLM or servegate (`/version`, `/v1/models`, `/metrics`), streams completions
with usage and logprobs, and records every request body it got, so tests can see exactly what servegate
sent (token ids after truncation, stop strings, cache salt). `answer` decides the text: by default the
reference engine's own greedy output for the prompt ids (a remote that serves the same model), or any
function of the prompt ids (a remote that answers differently). Fault switches plant what only timing shows:
a hidden global response cache (keyed on the whole body, or on all of it but the seed), and a prefix cache
that ignores vLLM's cache_salt.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from servegate.capacity.bench.local_server import free_port

PREFIX_BLOCK = 16
"""Tokens per block of the fake's prefix cache."""
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
    finish_reason: str = "length"
    """The finish_reason of every answer (`stop`: the answer ended at EOS)."""
    hidden_response_cache: bool = False
    """Fault: a global response cache nobody declared; an exactly repeated body answers 5x faster."""
    response_cache_ignores_seed: bool = False
    """The hidden response cache keys on the body without its `seed`, as many gateway caches do (greedy decoding
    does not use it): the same prompt with another seed is a hit too."""
    prefill_s_per_token: float = 0.0
    """Seconds before the first chunk per prompt token the prefix cache does not hold (added to delay_s)."""
    logprobs: bool = True
    """False: `logprobs` in a request is ignored and none are streamed (a remote that offers none)."""
    token_ids: Callable[[str], list[int]] | None = None
    """vLLM's `return_token_ids`: the ids of an answer's text (one per character, the rest in the last chunk),
    sent when the request asks for them; None: no ids are ever sent."""
    prefix_cache: Literal["off", "salted", "shared"] = "off"
    """Prefix cache of 16-token blocks: `salted` per cache_salt (as vLLM), `shared` ignoring it (the fault:
    tenants share entries, which only the time to first token shows: /metrics counts nothing)."""


@dataclass
class FakeRemote:
    """`with FakeRemote(behaviour) as remote: remote.url`; `remote.bodies` holds the completion bodies received."""

    behaviour: RemoteBehaviour = field(default_factory=RemoteBehaviour)
    port: int = field(default_factory=free_port)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight_max: int = 0
    _blocks: set[tuple[Any, tuple[int, ...]]] = field(default_factory=set)
    _responses: set[str] = field(default_factory=set)
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
            return StreamingResponse(self._stream(body, text, self._first_delay(body, ids)),
                                     media_type="text/event-stream")  # fmt: skip

        return app

    def _first_delay(self, body: dict[str, Any], ids: list[int]) -> float:
        """Seconds before the first chunk: delay_s, plus prefill of the uncached tokens; a response-cache hit 1/5."""
        b = self.behaviour
        delay = b.delay_s
        if b.prefix_cache != "off":
            salt = body.get("cache_salt") if b.prefix_cache == "salted" else None
            cached = 0
            for end in range(PREFIX_BLOCK, len(ids) + 1, PREFIX_BLOCK):
                key = (salt, tuple(ids[:end]))
                if key in self._blocks:
                    cached = end
                self._blocks.add(key)
            delay += b.prefill_s_per_token * (len(ids) - cached)
        else:
            delay += b.prefill_s_per_token * len(ids)
        if b.hidden_response_cache:
            keyed = {k: v for k, v in body.items() if k != "seed"} if b.response_cache_ignores_seed else body
            key_text = json.dumps(keyed, sort_keys=True)
            if key_text in self._responses:
                return delay / 5
            self._responses.add(key_text)
        return delay

    def _answer(self, ids: list[int], max_tokens: int) -> str:
        answer = self.behaviour.answer
        return answer(ids, max_tokens) if answer is not None else "x" * max_tokens

    async def _stream(self, body: dict[str, Any], text: str, delay_s: float) -> Any:
        self._in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self._in_flight)
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            want = body.get("logprobs") and self.behaviour.logprobs
            given = self.behaviour.token_ids
            ids = given(text) if given is not None and body.get("return_token_ids") else None
            for i, char in enumerate(text):
                choice: dict[str, Any] = {"index": 0, "text": char, "finish_reason": None}
                if want:
                    choice["logprobs"] = {"tokens": [char], "token_logprobs": [-0.5 - i / 100],
                                          "top_logprobs": [{char: -0.5 - i / 100}]}  # fmt: skip
                if ids is not None:
                    choice["token_ids"] = ids[i : i + 1]
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            end = {"index": 0, "text": "", "finish_reason": self.behaviour.finish_reason, "stop_reason": None}
            if ids is not None and ids[len(text) :]:
                end["token_ids"] = ids[len(text) :]
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
    from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

    engine = build(ServedModel.model_validate(manifest), fallback=False)
    lock = threading.Lock()

    def answer(ids: list[int], max_tokens: int) -> str:
        params = SamplingParams(max_tokens=max_tokens)
        with lock:
            [result] = engine.generate([GenerationRequest("remote", prompt_token_ids=ids, params=params)])
        return result.text if isinstance(result, FinishEvent) else ""

    return answer

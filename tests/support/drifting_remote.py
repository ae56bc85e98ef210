"""Remotes that break a manifest where only a probe shows it, for the contract gate's field measurements.

`DriftingRemote` is `FakeRemote` (identity, models and metrics routes) whose `/v1/completions` runs the
reference engine on the token ids it gets, sampling at the temperature and seed asked. It reports no
context length in /v1/models by default, as TGI and llama.cpp do not, and it can break the manifest in
three ways: serve a shorter `context` than declared (a prompt past it refused with 400 as vLLM does, or cut
from the left), ignore the request's seed (each request takes the next number of one counter, as an engine
with one global generator does), or ignore the temperature (every answer greedy).

`serve_app` runs any ASGI app (servegate's own server as a remote, or a `gate serve` to verify) on a free
loopback port in a thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from servegate.capacity.bench.local_server import free_port
from support.fake_remote import FakeRemote, RemoteBehaviour


def unreported() -> RemoteBehaviour:
    """A remote that names itself but reports no context length."""
    return RemoteBehaviour(engine="proxy", version="1.0", max_model_len=None)


@dataclass
class DriftingRemote(FakeRemote):
    """`with DriftingRemote(unreported(), manifest=..., context=96) as remote: remote.url`."""

    manifest: dict[str, Any] = field(default_factory=dict)
    """The reference manifest of the model it serves."""
    context: int = 128
    """Prompt plus output tokens it serves."""
    over_context: Literal["refuse", "truncate"] = "refuse"
    honours_seed: bool = True
    samples: bool = True
    """False: every answer is greedy, whatever the temperature."""
    honours_constraints: bool = True
    """False: a request's `structured_outputs` is ignored (the answer is unconstrained), as a server that drops
    the field does. Its manifest must declare postprocess.structured_output for it to honour them."""
    _engine: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _draws: int = 0

    def app(self) -> FastAPI:
        """FakeRemote's app with /v1/completions answered by the reference engine."""
        app = super().app()
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/v1/completions"]

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.bodies.append(body)
            ids = [int(t) for t in body["prompt"]] if isinstance(body["prompt"], list) else [1]
            max_tokens = int(body.get("max_tokens") or 16)
            if len(ids) + max_tokens > self.context:
                if self.over_context == "refuse":
                    message = (f"the context is {self.context} tokens; the request asks for {len(ids)} prompt "
                               f"and {max_tokens} output tokens")  # fmt: skip
                    error = {"message": message, "type": "BadRequestError", "code": 400}
                    return JSONResponse({"error": error}, status_code=400)
                ids = ids[-(self.context - max_tokens) :]
            text, tokens, finish = self._generate(ids, max_tokens, body)
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                     "total_tokens": len(ids) + len(tokens)}  # fmt: skip
            choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish, "stop_reason": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = tokens
            if not body.get("stream"):
                return {"id": "cmpl-drift", "object": "text_completion", "choices": [choice], "usage": usage}
            return StreamingResponse(_events(choice, usage), media_type="text/event-stream")

        return app

    def _generate(self, ids: list[int], max_tokens: int, body: dict[str, Any]) -> tuple[str, list[int], str]:
        """(text, token ids, finish_reason as vLLM says it) of the reference engine's answer."""
        from servegate.contracts.constraint_fields import ConstraintFields
        from servegate.contracts.manifest import ServedModel
        from servegate.runtime import build
        from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

        asked = body.get("structured_outputs") if self.honours_constraints else None
        constraint = ConstraintFields.model_validate({"structured_outputs": asked}).output_constraint()
        with self._lock:
            if self._engine is None:
                self._engine = build(ServedModel.model_validate(self.manifest), fallback=False)
            self._draws += 1
            seed = body.get("seed") if self.honours_seed else self._draws
            temperature = float(body.get("temperature", 1.0)) if self.samples else 0.0
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, constraint=constraint)
            [result] = self._engine.generate([GenerationRequest("drift", prompt_token_ids=ids, params=params)])
        if not isinstance(result, FinishEvent):
            return "", [], "length"
        return result.text, list(result.token_ids), "length" if result.finish_reason == "length" else "stop"


async def _events(choice: dict[str, Any], usage: dict[str, int]) -> Any:
    yield f"data: {json.dumps({'choices': [{**choice, 'finish_reason': None}]})}\n\n"
    end = {"index": 0, "text": "", "finish_reason": choice["finish_reason"], "stop_reason": None}
    yield f"data: {json.dumps({'choices': [end]})}\n\n"
    yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


@contextmanager
def serve_app(app: Any, ready_path: str = "/ready", timeout_s: float = 120.0) -> Iterator[str]:
    """Serve an ASGI app on 127.0.0.1 (lifespan on) in a thread; yields its root URL once `ready_path` answers
    200."""
    import httpx

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(url + ready_path, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end or not thread.is_alive():
                raise RuntimeError(f"the app on {url} did not become ready")
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)

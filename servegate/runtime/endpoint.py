"""`runtime.backend: endpoint`: the Engine interface over any OpenAI-compatible server (vLLM, TGI, SGLang, ours).

Every request is streamed (`stream: true`, usage in the last chunk), so TTFT and inter-token times are
those the client sees. Errors come back as catalogued errors: the remote's own error code when it is
in the catalogue, `overloaded` for 429, `deadline_exceeded` when the deadline passes, and
`model_unavailable` when the server cannot be reached or answers 5xx. This is how a deployment larger
than one machine is gated and benchmarked with the same manifest.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from servegate.contracts.errors import CATALOGUE, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.api import (
    EngineStats,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    Result,
    TokenEvent,
    Usage,
)


def _error_from_status(status: int, body: str) -> ServingError:
    """A catalogued error for a remote's non-200 answer."""
    code, message = None, body[:500]
    try:
        err = json.loads(body).get("error", {})
        if isinstance(err, dict):
            code, message = err.get("code"), str(err.get("message") or message)
    except (json.JSONDecodeError, AttributeError):
        pass
    if isinstance(code, str) and code in CATALOGUE and code not in ("overloaded", "internal"):
        return ServingError(code, detail=message, status=status)
    if status == 429:
        return ServingError("overloaded", retry_after=1, status=429)
    if status in (400, 404, 413, 415, 422):
        return ServingError("invalid_request", detail=f"the endpoint answered {status}: {message}")
    return ServingError("model_unavailable", detail=f"the endpoint answered {status}: {message}")


class EndpointEngine:
    """Forwards requests to `runtime.endpoint_url` (implements `servegate.runtime.api.Engine`)."""

    def __init__(self, served: ServedModel, *, client: httpx.AsyncClient | None = None) -> None:
        if not served.runtime.endpoint_url:
            raise ValueError("the endpoint backend needs runtime.endpoint_url")
        self.served = served
        base = served.runtime.endpoint_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = served.runtime.endpoint_model or served.name
        self._client = client
        self._lock = threading.Lock()
        self._in_flight = 0
        self._errors = 0

    async def start(self) -> None:
        """Open the connection pool (the remote is assumed up; its errors surface per request)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Wait up to grace_s for requests in flight, then close the pool."""
        end = time.monotonic() + grace_s
        while self._in_flight and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        p = request.params
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
        }
        if p.top_k:
            body["top_k"] = p.top_k
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop:
            body["stop"] = list(p.stop)
        if p.ignore_eos:
            body["ignore_eos"] = True
        if request.tenant:
            body["user"] = request.tenant
        if request.messages is not None:
            if p.logprobs:
                body.update(logprobs=True, top_logprobs=p.top_logprobs or None)
            return "/chat/completions", {**body, "messages": request.messages}
        if p.logprobs:
            body["logprobs"] = max(1, p.top_logprobs)
        prompt: Any = request.prompt if request.prompt is not None else list(request.prompt_token_ids or [])
        return "/completions", {**body, "prompt": prompt}

    async def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Stream one request from the endpoint: TokenEvents, then one FinishEvent or ErrorEvent."""
        if self._client is None:
            await self.start()
        assert self._client is not None
        arrival = request.arrival_time or time.monotonic()
        timeout = request.timeout_s or self.served.failure_policy.request_timeout_s
        path, body = self._body(request)
        with self._lock:
            self._in_flight += 1
        state: dict[str, Any] = {"text": "", "chunks": 0, "first": None, "reason": "length", "usage": None}
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in self._stream(path, body, request.id, state):
                    queue.put_nowait(event)
                queue.put_nowait(None)
            except BaseException as exc:  # handed to the consumer, which decides what it means
                queue.put_nowait(exc)

        task = asyncio.create_task(pump())
        try:
            while True:  # a deadline that works on Python 3.10 (no asyncio.timeout)
                remaining = arrival + timeout - time.monotonic()
                item = await asyncio.wait_for(queue.get(), timeout=max(0.0, remaining))
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
            now = time.monotonic()
            usage = state["usage"] or {}
            yield FinishEvent(
                request.id,
                state["text"],
                (),
                state["reason"],
                Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or state["chunks"])),
                ttft_s=None if state["first"] is None else state["first"] - arrival,
                e2e_s=now - arrival,
            )
        except (TimeoutError, asyncio.TimeoutError):
            self._errors += 1
            yield ErrorEvent(request.id, ServingError("deadline_exceeded", timeout_s=timeout))
        except ServingError as exc:
            self._errors += 1
            yield ErrorEvent(request.id, exc)
        except (httpx.HTTPError, OSError) as exc:
            self._errors += 1
            detail = f"cannot reach {self.base_url}: {type(exc).__name__}"
            yield ErrorEvent(request.id, ServingError("model_unavailable", detail=detail))
        finally:
            task.cancel()
            with self._lock:
                self._in_flight -= 1

    async def _stream(self, path: str, body: dict[str, Any], rid: str, state: dict[str, Any]) -> AsyncIterator[Event]:
        assert self._client is not None
        async with self._client.stream("POST", self.base_url + path, json=body) as resp:
            if resp.status_code != 200:
                raise _error_from_status(resp.status_code, (await resp.aread()).decode("utf-8", "replace"))
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    raise _error_from_status(int(err.get("status", 500)) if isinstance(err, dict) else 500, data)
                if chunk.get("usage"):
                    state["usage"] = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    text = choice.get("text")
                    if text is None:
                        text = (choice.get("delta") or {}).get("content") or ""
                    if choice.get("finish_reason"):
                        state["reason"] = "length" if choice["finish_reason"] == "length" else "stop"
                    if text:
                        now = time.monotonic()
                        state["first"] = state["first"] or now
                        state["text"] += text
                        state["chunks"] += 1
                        yield TokenEvent(rid, (), text, None, now)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Result]:
        """Run all requests concurrently against the endpoint; results in input order."""

        async def one(request: GenerationRequest) -> Result:
            final: Result | None = None
            async for event in self.submit(request):
                if isinstance(event, FinishEvent | ErrorEvent):
                    final = event
            assert final is not None
            return final

        async def all_of() -> list[Result]:
            try:
                return list(await asyncio.gather(*(one(r) for r in requests)))
            finally:
                if self._client is not None:  # the pool belongs to this event loop: close it with it
                    await self._client.aclose()
                    self._client = None

        out: list[list[Result]] = []
        thread = threading.Thread(target=lambda: out.append(asyncio.run(all_of())))  # safe inside a running loop
        thread.start()
        thread.join()
        return out[0]

    async def embed(self, texts: Sequence[str], tenant: str | None = None) -> list[list[float]]:
        """Embeddings from the endpoint's /embeddings."""
        if self._client is None:
            await self.start()
        assert self._client is not None
        body: dict[str, Any] = {"model": self.model, "input": list(texts)}
        if tenant:
            body["user"] = tenant
        resp = await self._client.post(self.base_url + "/embeddings", json=body)
        if resp.status_code != 200:
            raise _error_from_status(resp.status_code, resp.text)
        return [item["embedding"] for item in sorted(resp.json()["data"], key=lambda d: d["index"])]

    def stats(self) -> EngineStats:
        """Requests in flight (the remote's own queue is not visible from here)."""
        return EngineStats(running=self._in_flight)

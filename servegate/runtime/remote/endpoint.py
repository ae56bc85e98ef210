"""`runtime.backend: endpoint`: an OpenAI-compatible server (vLLM, TGI, SGLang, ours) as the engine core,
wrapped in the manifest's contract exactly as servegate's own engine is (runtime/contract_layer.py).

Here, before the remote sees a request: sampling limits, the chat template, the input limit and truncation
policy (the remote gets token ids, so it runs what the manifest says it runs), the output cap and stop
strings, the response cache and the bounded queue (`batching.max_batch_size` in flight, `max_queue`
waiting, then `overloaded` with Retry-After). After: stop strings, the output schema, logprobs as the
remote returns them. Around it: the deadline and the fallback. Every request is streamed (usage in the
last chunk), so TTFT and inter-token times are those a client sees. Errors come back catalogued:
`overloaded` for 429, `deadline_exceeded` at the deadline, `model_unavailable` when the remote cannot be
reached or answers 5xx. What the remote is (engine, version, model, context) is read at start
(`identity`); a remote that cannot be reached at start raises RemoteUnavailable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from servegate.contracts.errors import CATALOGUE, RemoteUnavailable, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.contract_layer import (
    AdmissionQueue,
    AdmittedRequest,
    ContractParts,
    admit,
    contract_parts,
    salt_token,
    trim_at_stop,
)
from servegate.runtime.engine.interface import (
    EngineStats,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    Result,
    ScoreResult,
    TokenEvent,
    Usage,
)
from servegate.runtime.failure_policy.fallback import FallbackRoute
from servegate.runtime.failure_policy.outcomes import Trigger, deadline_exceeded, unavailable
from servegate.runtime.remote.identity import RemoteIdentity, probe_identity
from servegate.runtime.remote.own_loop import run_on_own_loop


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


_TRIGGER_OF = {
    "overloaded": "overload",
    "deadline_exceeded": "timeout",
    "model_unavailable": "error",
    "internal": "error",
}
"""Which fallback trigger a remote's failure is (other errors are the client's and go back to it)."""


@dataclasses.dataclass
class _Reply:
    """What the remote streamed for one request."""

    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[dict[str, float]] = dataclasses.field(default_factory=list)
    first: float | None = None
    finish: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None
    streamed: bool = False


class EndpointEngine:
    """The manifest's contract around a remote OpenAI-compatible server (implements `engine.interface.Engine`)."""

    def __init__(
        self,
        served: ServedModel,
        *,
        fallback: Any = None,
        client: httpx.AsyncClient | None = None,
        tokenizer: Any = None,
        base_url: str | None = None,
    ) -> None:
        """`fallback`: the fallback manifest's engine; `client`, `tokenizer`: given parts (tests); `base_url`:
        the server's API URL when the manifest does not name one (a server servegate started itself)."""
        url = base_url or served.runtime.endpoint_url
        if not url:
            raise ValueError("the endpoint backend needs runtime.endpoint_url")
        self.served = served
        base = url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = served.runtime.endpoint_model or served.name
        self.identity: RemoteIdentity | None = None
        """What the remote reported at start: engine, version, models, context length."""
        self.contract: ContractParts | None = None
        self.admission = AdmissionQueue(served)
        self._fallback = (
            FallbackRoute(fallback, served.failure_policy.fallback.triggers) if fallback is not None else None
        )
        self._given_client = client
        self._tokenizer = tokenizer
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._start_lock = threading.Lock()
        self._in_flight = 0
        self._lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the tokenizer, read the remote's identity (RemoteUnavailable when it cannot be reached)."""
        await asyncio.to_thread(self.start_sync)

    def start_sync(self) -> None:
        """start() for synchronous callers; a second call does nothing."""
        with self._start_lock:
            if self.contract is not None:
                return
            if self._tokenizer is None:
                from servegate.runtime.model.weights import load_tokenizer

                self._tokenizer = load_tokenizer(self.served)
            identity = asyncio.run(probe_identity(self.base_url, self.model))
            self.identity = identity
            self.contract = contract_parts(self.served, self._tokenizer)
            if self._fallback is not None:
                self._fallback.start_sync()

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Wait up to grace_s for requests in flight, then close this loop's connection pool."""
        end = time.monotonic() + grace_s
        while self._in_flight and time.monotonic() < end:
            await asyncio.sleep(0.05)
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None and client is not self._given_client:
            await client.aclose()
        if self._fallback is not None:
            await asyncio.to_thread(self._fallback.shutdown_sync, grace_s)

    def _client(self) -> httpx.AsyncClient:
        """The connection pool of the running event loop (a pool cannot move between loops)."""
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = self._given_client or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        return self._clients[loop]

    # --- requests -------------------------------------------------------------------------------

    async def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Apply the contract, stream the request from the remote: TokenEvents, then one Finish or ErrorEvent."""
        if self.contract is None:
            try:
                await self.start()
            except RemoteUnavailable as exc:  # a gateway whose remote is down answers each request with it
                yield ErrorEvent(request.id, unavailable(str(exc)))
                return
        assert self.contract is not None
        try:
            admitted = admit(self.served, self.contract.preprocessor, request)
        except ServingError as error:
            yield ErrorEvent(request.id, error)
            return
        cache = self.contract.response_cache
        hit = cache.get(request) if cache is not None else None
        if hit is not None:
            yield TokenEvent(request.id, hit.token_ids, hit.text, hit.logprobs, time.monotonic(), cached=True)
            yield hit
            return
        reply = _Reply()
        with self._lock:
            self._in_flight += 1
        try:
            async for event in self._remote(admitted, reply):
                if isinstance(event, ErrorEvent):
                    trigger = _TRIGGER_OF.get(event.error.code)
                    if trigger is not None and not reply.streamed and self._covers(trigger):  # type: ignore[arg-type]
                        async for relayed in self._via_fallback(request):
                            yield relayed
                        return
                yield event
                reply.streamed = reply.streamed or isinstance(event, TokenEvent)
        finally:
            with self._lock:
                self._in_flight -= 1

    async def _remote(self, admitted: AdmittedRequest, reply: _Reply) -> AsyncIterator[Event]:
        """Wait for a slot, then stream from the remote until the deadline: TokenEvents, then the final event."""
        request = admitted.request
        if time.monotonic() >= admitted.deadline:  # it arrived past its deadline: nothing to send
            yield ErrorEvent(request.id, deadline_exceeded(admitted.timeout_s))
            return
        try:
            await self.admission.acquire(admitted.deadline)
        except ServingError as error:
            yield ErrorEvent(request.id, error)
            return
        except (TimeoutError, asyncio.TimeoutError):
            yield ErrorEvent(request.id, deadline_exceeded(admitted.timeout_s))
            return
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in self._stream(admitted, reply):
                    queue.put_nowait(event)
                queue.put_nowait(None)
            except BaseException as exc:  # handed to the consumer, which decides what it means
                queue.put_nowait(exc)

        task = asyncio.create_task(pump())
        try:
            while True:  # a deadline that works on Python 3.10 (no asyncio.timeout)
                remaining = admitted.deadline - time.monotonic()
                item = await asyncio.wait_for(queue.get(), timeout=max(0.0, remaining))
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
            yield self._finish(admitted, reply)
        except (TimeoutError, asyncio.TimeoutError):
            yield ErrorEvent(request.id, deadline_exceeded(admitted.timeout_s))
        except ServingError as error:
            yield ErrorEvent(request.id, error)
        except (httpx.HTTPError, OSError, json.JSONDecodeError) as exc:
            yield ErrorEvent(request.id, unavailable(f"cannot reach {self.base_url}: {type(exc).__name__}"))
        finally:
            task.cancel()
            self.admission.release()

    def _body(self, admitted: AdmittedRequest) -> dict[str, Any]:
        """The completions request the remote gets: the prompt as the manifest made it, as token ids."""
        p = admitted.request.params
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": admitted.token_ids,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": admitted.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "seed": admitted.seed,
        }
        if p.top_k:
            body["top_k"] = p.top_k
        if admitted.stop:
            body["stop"] = list(admitted.stop)
        if p.ignore_eos:
            body["ignore_eos"] = True
        if p.logprobs or p.top_logprobs:
            body["logprobs"] = max(1, p.top_logprobs)
        if self.identity is not None and self.identity.engine == "vllm":
            body["return_token_ids"] = True  # token ids as generated, not re-tokenized text
            salt = salt_token(self.served, admitted.cache_salt)
            if salt is not None:
                body["cache_salt"] = salt  # vLLM's prefix cache, scoped per tenant as the manifest says
        return body

    async def _stream(self, admitted: AdmittedRequest, reply: _Reply) -> AsyncIterator[Event]:
        rid = admitted.request.id
        async with self._client().stream("POST", self.base_url + "/completions", json=self._body(admitted)) as resp:
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
                    raise _error_from_status(int(err.get("code", 500)) if isinstance(err, dict) else 500, data)
                if chunk.get("usage"):
                    reply.usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    event = _read_choice(rid, choice, reply)
                    if event is not None:
                        yield event

    def _finish(self, admitted: AdmittedRequest, reply: _Reply) -> FinishEvent | ErrorEvent:
        """The final result with the manifest's postprocess applied: stop strings, the output schema."""
        request, now = admitted.request, time.monotonic()
        text, stopped = trim_at_stop(reply.text, admitted.stop)
        token_ids = reply.token_ids
        if not token_ids and text:  # a remote that does not return ids: the manifest's tokenizer reads the text
            token_ids = list(self._tokenizer(text, add_special_tokens=False)["input_ids"])
        if stopped or isinstance(reply.stop_reason, str):
            reason = "stop"
        elif reply.finish == "stop":
            reason = "eos"
        else:
            reason = "length"
        valid = None
        validator = self.contract.validator if self.contract is not None else None
        if validator is not None:
            problem = validator.problem(text)
            valid = problem is None
            if problem is not None and self.served.failure_policy.on_invalid_output == "error":
                return ErrorEvent(request.id, ServingError("invalid_output", detail=problem))
        usage = reply.usage or {}
        params = request.params
        result = FinishEvent(
            request_id=request.id,
            text=text,
            token_ids=tuple(token_ids),
            finish_reason=reason,  # type: ignore[arg-type]
            usage=Usage(
                len(admitted.token_ids),
                int(usage.get("completion_tokens") or len(token_ids)),
                admitted.truncated_tokens,
            ),
            logprobs=tuple(reply.logprobs) if params.logprobs else None,
            top_logprobs=tuple(reply.top_logprobs) if params.top_logprobs > 0 else None,
            output_valid=valid,
            ttft_s=None if reply.first is None else reply.first - admitted.arrival,
            e2e_s=now - admitted.arrival,
        )
        cache = self.contract.response_cache if self.contract is not None else None
        if cache is not None:
            cache.put(request, result)
        return result

    # --- the fallback ---------------------------------------------------------------------------

    def _covers(self, trigger: Trigger) -> bool:
        return self._fallback is not None and self._fallback.covers(trigger)

    async def _via_fallback(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """The request served whole by the fallback engine (its result marked fallback_used)."""
        assert self._fallback is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._fallback.forward(request, lambda event: loop.call_soon_threadsafe(queue.put_nowait, event))
        while True:
            event = await queue.get()
            yield event
            if isinstance(event, (FinishEvent, ErrorEvent)):
                return

    # --- the rest of the Engine interface -------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Result]:
        """Run all requests against the endpoint, at most feed_window() at once; results in input order."""
        from servegate.runtime.failure_policy.outcomes import feed_window

        self.start_sync()

        async def one(request: GenerationRequest, window: asyncio.Semaphore) -> Result:
            async with window:
                final: Result | None = None
                async for event in self.submit(request):  # no arrival time: the deadline counts from here
                    if isinstance(event, (FinishEvent, ErrorEvent)):
                        final = event
                assert final is not None
                return final

        async def all_of() -> list[Result]:
            window = asyncio.Semaphore(feed_window(self.served))
            try:
                return list(await asyncio.gather(*(one(r, window) for r in requests)))
            finally:
                client = self._clients.pop(asyncio.get_running_loop(), None)  # the pool dies with this loop
                if client is not None and client is not self._given_client:
                    await client.aclose()

        return run_on_own_loop(all_of)

    def score(self, requests: Sequence[GenerationRequest]) -> list[ScoreResult]:
        """Prompt-token log-probabilities from the remote (`echo` with `logprobs`, endpoint_scoring.py), in order."""
        from servegate.runtime.failure_policy.outcomes import feed_window
        from servegate.runtime.remote.endpoint_scoring import score_on_remote

        self.start_sync()
        return score_on_remote(self, requests, feed_window(self.served))

    error_from_status = staticmethod(_error_from_status)
    """A remote's non-200 answer as a catalogued error (endpoint_scoring reads answers too)."""

    async def embed(self, texts: Sequence[str], tenant: str | None = None) -> list[list[float]]:
        """Embeddings from the endpoint's /embeddings."""
        body: dict[str, Any] = {"model": self.model, "input": list(texts)}
        if tenant:
            body["user"] = tenant
        try:
            resp = await self._client().post(self.base_url + "/embeddings", json=body)
        except (httpx.HTTPError, OSError) as exc:
            raise unavailable(f"cannot reach {self.base_url}: {type(exc).__name__}") from None
        if resp.status_code != 200:
            raise _error_from_status(resp.status_code, resp.text)
        return [item["embedding"] for item in sorted(resp.json()["data"], key=lambda d: d["index"])]

    def stats(self) -> EngineStats:
        """The contract's own counters (the remote's internal queue and caches are not visible from here)."""
        cache = self.contract.response_cache if self.contract is not None else None
        return EngineStats(
            queue_depth=self.admission.queued,
            running=self.admission.running,
            response_cache_hits=cache.hits if cache is not None else 0,
            fallback_uses=self._fallback.uses if self._fallback is not None else 0,
        )


def _read_choice(rid: str, choice: dict[str, Any], reply: _Reply) -> TokenEvent | None:
    """Fold one streamed completions choice into `reply`; a TokenEvent when it carries text."""
    text = choice.get("text") or ""
    if choice.get("finish_reason"):
        reply.finish = str(choice["finish_reason"])
        reply.stop_reason = choice.get("stop_reason")
    ids = [int(t) for t in choice.get("token_ids") or []]
    reply.token_ids.extend(ids)
    logprobs = choice.get("logprobs") or {}
    values = [float(v) for v in logprobs.get("token_logprobs") or [] if v is not None]
    reply.logprobs.extend(values)
    reply.top_logprobs.extend(dict(t) for t in logprobs.get("top_logprobs") or [] if t is not None)
    if not text and not ids:
        return None
    now = time.monotonic()
    reply.first = reply.first or now
    reply.text += text
    return TokenEvent(rid, tuple(ids), text, tuple(values) if values else None, now)


__all__ = ["EndpointEngine"]

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
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from servegate.contracts.errors import RemoteUnavailable, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.contract_layer import (
    AdmissionQueue,
    AdmittedRequest,
    ContractParts,
    admit,
    contract_parts,
    salt_token,
)
from servegate.runtime.engine.fallback_route import FallbackRoute
from servegate.runtime.engine.interface import Engine
from servegate.runtime.engine.sink_relay import SinkRelay
from servegate.runtime.failure_policy.outcomes import (
    deadline_exceeded,
    feed_window,
    past_deadline,
    trigger_of,
    unavailable,
)
from servegate.runtime.remote.completions_stream import (
    RemoteReply,
    completions_body,
    error_from_status,
    final_event,
    no_logprobs,
    read_choice,
)
from servegate.runtime.remote.identity import RemoteIdentity, probe_identity
from servegate.runtime.remote.own_loop import run_on_own_loop
from servegate.runtime.remote.token_source import TokenReader
from servegate.runtime.response_cache import replay
from servegate.runtime.types import (
    EngineStats,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    Result,
    ScoreResult,
    Sink,
    TokenEvent,
)


class EndpointEngine:
    """The manifest's contract around a remote OpenAI-compatible server (implements `engine.interface.Engine`)."""

    def __init__(
        self,
        served: ServedModel,
        *,
        fallback: Engine | None = None,
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
        # a fallback engine is built only for a manifest that declares failure_policy.fallback
        self._fallback = (
            FallbackRoute(fallback, served.failure_policy.fallback.triggers)  # type: ignore[union-attr]
            if fallback is not None
            else None
        )
        self.given_client = client
        """The transport a test gave (used on every loop, never closed here); None: a pool per event loop."""
        self._tokenizer = tokenizer
        self._reader: TokenReader | None = None
        self.names_tokens = True
        self._prefix_hits = 0
        """KV blocks the remote's usage says it read from its prefix cache (0 when it never says)."""
        """Whether to ask a remote other than vLLM for logprobs to learn its tokens (False once it refused them)."""
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._relay = SinkRelay("servegate-endpoint-relay")
        """Where enqueue() streams requests from (its own event loop, started on first use)."""
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
            self._reader = TokenReader(self._tokenizer)
            self.contract = contract_parts(self.served, self._tokenizer)
            if self._fallback is not None:
                self._fallback.start_sync()

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Wait up to grace_s for requests in flight, then close this loop's and the relay's connection pools."""
        end = time.monotonic() + grace_s
        while self._in_flight and time.monotonic() < end:
            await asyncio.sleep(0.05)
        await self._close_pool()
        if self._relay.loop is not None:
            await asyncio.to_thread(self._relay.run, self._close_pool)
            self._relay.stop()
        if self._fallback is not None:
            await asyncio.to_thread(self._fallback.shutdown_sync, grace_s)

    def shutdown_sync(self, grace_s: float = 10.0) -> None:
        """shutdown() for synchronous callers."""
        run_on_own_loop(lambda: self.shutdown(grace_s))

    async def _close_pool(self) -> None:
        """Close the running loop's connection pool (a given transport stays open)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None and client is not self.given_client:
            await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        """The connection pool of the running event loop (a pool cannot move between loops)."""
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = self.given_client or httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
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
            for cached in replay(hit):
                yield cached
            return
        reply = RemoteReply()
        with self._lock:
            self._in_flight += 1
        try:
            async for event in self._remote(admitted, reply):
                if isinstance(event, ErrorEvent) and self._to_fallback(event.error, reply.streamed):
                    async for relayed in self._via_fallback(request):
                        yield relayed
                    return
                yield event
                reply.streamed = reply.streamed or isinstance(event, TokenEvent)
        finally:
            with self._lock:
                self._in_flight -= 1

    async def _remote(self, admitted: AdmittedRequest, reply: RemoteReply) -> AsyncIterator[Event]:
        """Wait for a slot, then stream from the remote until the deadline: TokenEvents, then the final event."""
        request = admitted.request
        if past_deadline(time.monotonic(), admitted.deadline):  # it arrived past its deadline: nothing to send
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

    @property
    def _vllm(self) -> bool:
        return self.identity is not None and self.identity.engine == "vllm"

    def _body(self, admitted: AdmittedRequest) -> dict[str, Any]:
        """The completions request the remote gets: vLLM also gets token ids back and the tenant's cache salt;
        any other remote is asked for logprobs, which name its tokens (token_source.py)."""
        vllm = self._vllm
        salt = salt_token(self.served, admitted.cache_salt) if vllm else None
        return completions_body(self.model, admitted, salt, vllm, token_logprobs=not vllm and self.names_tokens)

    def _finish(self, admitted: AdmittedRequest, reply: RemoteReply) -> FinishEvent | ErrorEvent:
        """The final result with the manifest's postprocess applied, cached when the manifest caches."""
        assert self.contract is not None and self._reader is not None
        result = final_event(self.served, self.contract.validator, self._reader, admitted, reply, self.base_url)
        cache = self.contract.response_cache
        if cache is not None and isinstance(result, FinishEvent):
            cache.put(admitted.request, result)
        if isinstance(result, FinishEvent) and result.usage.cached_tokens:
            kv = self.served.runtime.kv_cache
            self._prefix_hits += result.usage.cached_tokens // (kv.block_size if kv is not None else 16)
        return result

    async def _open(self, admitted: AdmittedRequest) -> Any:
        """POST the streamed request; a remote that refuses the logprobs asked only to name tokens is asked
        again without them (and not again later). A refusal of logprobs the client asked for is theirs."""
        params = admitted.request.params
        while True:
            body = self._body(admitted)
            resp = await self._client().send(
                self._client().build_request("POST", self.base_url + "/completions", json=body), stream=True
            )
            if resp.status_code == 200:
                return resp
            text = (await resp.aread()).decode("utf-8", "replace")
            await resp.aclose()
            error = error_from_status(resp.status_code, text)
            if resp.status_code == 400 and "logprobs" in body and _names(text, "logprobs"):
                if not (params.logprobs or params.top_logprobs):
                    self.names_tokens = False  # it offers none: its tokens come from the text from now on
                    continue
                raise no_logprobs(self.base_url, f"it answered 400: {error.message}")
            raise error

    async def _stream(self, admitted: AdmittedRequest, reply: RemoteReply) -> AsyncIterator[Event]:
        rid = admitted.request.id
        params = admitted.request.params
        resp = await self._open(admitted)
        try:
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    err = chunk["error"]
                    raise error_from_status(int(err.get("code", 500)) if isinstance(err, dict) else 500, data)
                if chunk.get("usage"):
                    reply.usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    event = read_choice(rid, choice, reply, params.logprobs, params.top_logprobs > 0)
                    if event is None:
                        continue
                    if params.logprobs and not reply.logprobs:  # refused before anything streams: a proper status
                        raise no_logprobs(self.base_url, "its first token came without token_logprobs")
                    yield event
        finally:
            await resp.aclose()

    # --- the fallback ---------------------------------------------------------------------------

    def _to_fallback(self, error: ServingError, streamed: bool) -> bool:
        """Whether the failure policy hands this failure to the fallback engine."""
        return self._fallback is not None and self._fallback.takes(trigger_of(error), streamed)

    async def _via_fallback(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """The request served whole by the fallback engine (its result marked fallback_used)."""
        assert self._fallback is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def sink(event: Event) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        self._fallback.forward(request, sink)
        while True:
            event = await queue.get()
            yield event
            if isinstance(event, (FinishEvent, ErrorEvent)):
                return

    # --- the rest of the Engine interface -------------------------------------------------------

    def enqueue(self, request: GenerationRequest, sink: Sink) -> None:
        """submit() on the engine's relay loop, from any thread; the events go to `sink`."""
        self._relay.enqueue(self.submit, request, sink)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Result]:
        """Run all requests against the endpoint, at most feed_window() at once; results in input order."""
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
                await self._close_pool()  # the pool dies with this loop

        return run_on_own_loop(all_of)

    @property
    def scores_prompts(self) -> bool:
        """The remote scores prompts with `echo` and `logprobs` (a remote that refuses them answers an error)."""
        return True

    def score(self, requests: Sequence[GenerationRequest]) -> list[ScoreResult]:
        """Prompt-token log-probabilities from the remote (`echo` with `logprobs`, endpoint_scoring.py), in order."""
        from servegate.runtime.remote.endpoint_scoring import score_on_remote

        self.start_sync()
        return score_on_remote(self, requests, feed_window(self.served))

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
            raise error_from_status(resp.status_code, resp.text)
        return [item["embedding"] for item in sorted(resp.json()["data"], key=lambda d: d["index"])]

    def count_tokens(self, text: str) -> int | None:
        """Tokens `text` becomes under the manifest's tokenizer and preprocessor (None until start())."""
        if self.contract is None:
            return None
        return len(self.contract.preprocessor.encode(GenerationRequest(id="count", prompt=text)).token_ids)

    @property
    def preprocessor(self) -> Any:
        """The manifest's Preprocessor servegate applies in front of the remote (None until start())."""
        return self.contract.preprocessor if self.contract is not None else None

    @property
    def tokenizer(self) -> Any:
        """The manifest's tokenizer, loaded at start to encode prompts for the remote (None until start())."""
        return self._tokenizer if self.contract is not None else None

    @property
    def why_no_tokenizer(self) -> str | None:
        """Why `tokenizer` is None: the engine has not started."""
        return "the engine has not started" if self.contract is None else None

    @property
    def remote(self) -> bool:
        """The model runs on the remote server."""
        return True

    def stats(self) -> EngineStats:
        """The contract's own counters, and the prefix-cache hits the remote's usage reported (in blocks of the
        manifest's block_size); the remote's internal queue is not visible from here."""
        cache = self.contract.response_cache if self.contract is not None else None
        return EngineStats(
            queue_depth=self.admission.queued,
            running=self.admission.running,
            prefix_cache_hits=self._prefix_hits,
            response_cache_hits=cache.hits if cache is not None else 0,
            fallback_uses=self._fallback.uses if self._fallback is not None else 0,
        )


def _names(body: str, param: str) -> bool:
    """Whether a remote's error body is about `param` (its `param` field, else its message names it)."""
    try:
        err = json.loads(body).get("error", {})
    except (json.JSONDecodeError, AttributeError):
        return param in body
    if not isinstance(err, dict):
        return param in body
    return err.get("param") == param or param in str(err.get("message") or "")


__all__ = ["EndpointEngine"]

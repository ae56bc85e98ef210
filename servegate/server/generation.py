"""Run one engine request for the server: the server-side deadline, error mapping (the requests come from
runtime/request_translator.py).

Every request ends in exactly one outcome: a FinishEvent or one catalogued ServingError. Errors the
engine reports keep their code; `overloaded` gets the manifest's status and Retry-After; a deadline
passed while waiting on the engine is `deadline_exceeded` (504); anything else the engine raises is
`internal` (500), logged by incident id without request data.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.runtime.failure_policy.outcomes import deadline_exceeded, gateway_deadline
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, TokenEvent
from servegate.server.bodies import BodyBuilder, token_texts
from servegate.server.state import ServerState, internal_error, normalize


@dataclass
class EngineRun:
    """The events of one request on the engine, read with the server-side deadline."""

    state: ServerState
    request: GenerationRequest
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    tokens: list[TokenEvent] = field(default_factory=list)
    _events: AsyncIterator[object] | None = None

    @property
    def deadline(self) -> float:
        """time.monotonic() after which the server answers deadline_exceeded (a safety net behind the engine's)."""
        return gateway_deadline(self.state.served.failure_policy, self.arrival)

    async def next(self) -> TokenEvent | FinishEvent:
        """The next event; a ServingError for an engine error, a passed deadline or an engine fault."""
        if self._events is None:
            self._events = aiter(self.state.engine.submit(self.request))
        remaining = self.deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise asyncio.TimeoutError
            event = await asyncio.wait_for(anext(self._events), remaining)
        except asyncio.TimeoutError:  # an alias of TimeoutError from Python 3.11 on
            await self.close()
            raise deadline_exceeded(self.state.served.failure_policy.request_timeout_s) from None
        except StopAsyncIteration:
            raise internal_error(RuntimeError("the engine ended a request without a result")) from None
        except ServingError as error:
            raise normalize(error, self.state.served) from None
        except Exception as exc:
            raise internal_error(exc) from None
        if isinstance(event, ErrorEvent):
            refusal = normalize(event.error, self.state.served)
            if refusal.code == "input_too_long" and refusal.param is None:
                refusal.param = "messages" if self.request.messages is not None else "prompt"
            raise refusal
        if isinstance(event, TokenEvent):
            if self.first_token_at is None:
                self.first_token_at = time.monotonic()
            self.tokens.append(event)
            return event
        if isinstance(event, FinishEvent):
            return event
        raise internal_error(TypeError(f"the engine sent an unknown event {type(event).__name__}"))

    async def close(self) -> None:
        """Release the engine's iterator (a client that leaves cancels its request)."""
        events, self._events = self._events, None
        closer = getattr(events, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except Exception:  # closing an already failed iterator must not mask the original outcome
                pass

    def ttft_s(self, finish: FinishEvent) -> float | None:
        """Seconds from arrival to the first token (the engine's figure when it gives one)."""
        if finish.ttft_s is not None:
            return finish.ttft_s
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    def record(self, endpoint: str, finish: FinishEvent) -> None:
        """Record the finished request's latencies and tokens in the metrics."""
        self.state.metrics.generation_done(endpoint, finish, self.ttft_s(finish), time.monotonic() - self.arrival)


async def run_to_finish(run: EngineRun) -> FinishEvent:
    """Read a request's events to its FinishEvent (a ServingError otherwise)."""
    try:
        while True:
            event = await run.next()
            if isinstance(event, FinishEvent):
                return event
    finally:
        await run.close()


async def first_failure(tasks: Sequence[asyncio.Future[Any]]) -> BaseException | None:
    """Wait for every task, or until one fails (the rest are then cancelled); the first failure by position."""
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return next((t.exception() for t in tasks if not t.cancelled() and t.exception() is not None), None)


async def run_all(runs: list[EngineRun]) -> list[FinishEvent]:
    """Run every choice's request at once; the first failure (by choice index) cancels the rest and is raised."""
    tasks = [asyncio.ensure_future(run_to_finish(run)) for run in runs]
    error = await first_failure(tasks)
    if error is not None:
        raise error
    return [task.result() for task in tasks]


def cache_state(state: ServerState, finishes: list[bool]) -> str | None:
    """`hit` (every choice from the response cache), `miss`, `partial`; None when no response cache is declared."""
    if not state.served.postprocess.response_cache.enabled:
        return None
    if all(finishes):
        return "hit"
    return "partial" if any(finishes) else "miss"


def _tokenizer(state: ServerState) -> Any:
    """The engine's tokenizer, None where it has none."""
    return state.engine.tokenizer


def token_strings(state: ServerState, run: EngineRun, finish: FinishEvent) -> list[str]:
    """Each generated token's own text, as the top alternatives name tokens (EOS as the tokenizer writes it)."""
    if finish.tokens is not None:  # the engine named them (an endpoint: as the remote's logprobs did)
        return list(finish.tokens)
    tokenizer = _tokenizer(state)
    if tokenizer is None:
        return token_texts(run.tokens)
    return [tokenizer.decode([int(token)]) for token in finish.token_ids]


def event_token_strings(state: ServerState, event: TokenEvent) -> list[str]:
    """The own text of each token of one streamed event, named as token_strings names them."""
    if event.tokens is not None:
        return list(event.tokens)
    tokenizer = _tokenizer(state)
    if tokenizer is None or not event.token_ids:
        return token_texts([event])
    return [tokenizer.decode([int(token)]) for token in event.token_ids]


async def complete(
    state: ServerState, endpoint: str, chat: bool, requests: list[GenerationRequest], builder: BodyBuilder
) -> tuple[int, dict[str, object], dict[str, str]]:
    """Run a non-streamed request's choices to their outcome: (status, OpenAI-shaped body, headers)."""
    runs = [EngineRun(state, request) for request in requests]
    headers = {"X-Request-Id": builder.id}
    try:
        finishes = await run_all(runs)
    except ServingError as error:
        return error.status, error.to_body(), {**error.headers(), **headers}
    for run, finish in zip(runs, finishes, strict=True):
        run.record(endpoint, finish)
    builder.cache = cache_state(state, [f.cached for f in finishes])
    if builder.cache is not None:
        headers["X-Servegate-Cache"] = builder.cache
    pairs = zip(runs, finishes, strict=True)
    choices = [(f, token_strings(state, run, f) if f.logprobs is not None else []) for run, f in pairs]
    body = builder.chat(choices) if chat else builder.completion(choices)
    return 200, body, headers

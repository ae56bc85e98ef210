"""Run one parsed request on the engine: the engine request, the server-side deadline, error mapping.

Every request ends in exactly one outcome: a FinishEvent or one catalogued ServingError. Errors the
engine reports keep their code; `overloaded` gets the manifest's status and Retry-After; a deadline
passed while waiting on the engine is `deadline_exceeded` (504); anything else the engine raises is
`internal` (500), logged by incident id without request data.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from servegate.contracts.errors import ServingError
from servegate.contracts.requests import ChatCompletionRequest, CompletionRequest
from servegate.runtime.api import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams, TokenEvent
from servegate.server.bodies import BodyBuilder, token_texts
from servegate.server.state import ServerState, internal_error, normalize

# The engine enforces the deadline itself and says why; the server's own timer is a safety net that
# fires slightly later, so the engine's more precise error wins when it has one.
_DEADLINE_SLACK_S = 0.25


def engine_request(
    served_max_output: int, request: CompletionRequest | ChatCompletionRequest, request_id: str, tenant: str | None
) -> GenerationRequest:
    """The engine's view of a completion or chat request."""
    if isinstance(request, ChatCompletionRequest):
        max_tokens = request.max_completion_tokens or request.max_tokens or served_max_output
        top_logprobs = request.top_logprobs or 0
    else:
        max_tokens = request.max_tokens
        top_logprobs = request.logprobs or 0
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=request.seed,
        stop=tuple(request.stop or ()),
        logprobs=request.wants_logprobs(),
        top_logprobs=top_logprobs,
        ignore_eos=request.ignore_eos,
    )
    generation = GenerationRequest(id=request_id, params=params, tenant=tenant, arrival_time=time.monotonic())
    if isinstance(request, ChatCompletionRequest):
        generation.messages = [
            {"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in request.messages
        ]
    elif isinstance(request.prompt, str):
        generation.prompt = request.prompt
    else:
        generation.prompt_token_ids = list(request.prompt)
    return generation


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
        """time.monotonic() after which the server answers deadline_exceeded."""
        return self.arrival + self.state.served.failure_policy.request_timeout_s + _DEADLINE_SLACK_S

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
            timeout = self.state.served.failure_policy.request_timeout_s
            raise ServingError("deadline_exceeded", timeout_s=timeout) from None
        except StopAsyncIteration:
            raise internal_error(RuntimeError("the engine ended a request without a result")) from None
        except ServingError as error:
            raise normalize(error, self.state.served) from None
        except Exception as exc:
            raise internal_error(exc) from None
        if isinstance(event, ErrorEvent):
            error = normalize(event.error, self.state.served)
            if error.code == "input_too_long" and error.param is None:
                error.param = "messages" if self.request.messages is not None else "prompt"
            raise error
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


async def complete(
    state: ServerState, endpoint: str, chat: bool, request: GenerationRequest, builder: BodyBuilder
) -> tuple[int, dict[str, object], dict[str, str]]:
    """Run a non-streamed request to its outcome: (status, OpenAI-shaped body, headers)."""
    run = EngineRun(state, request)
    try:
        finish = await run_to_finish(run)
    except ServingError as error:
        return error.status, error.to_body(), {**error.headers(), "X-Request-Id": request.id}
    run.record(endpoint, finish)
    tokens = token_texts(run.tokens)
    body = builder.chat(finish, tokens) if chat else builder.completion(finish, tokens)
    return 200, body, {"X-Request-Id": request.id}

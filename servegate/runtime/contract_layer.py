"""The manifest's contract around any engine core: what every backend applies the same way.

    request -> admit (sampling limits, chat template, input limit and truncation, output cap, stops,
               tenant -> cache salt, deadline)                       [preprocess]
            -> response cache -> bounded admission (queue, overload)  [postprocess, failure policy]
            -> engine core (servegate's scheduler and model, or a remote OpenAI-compatible server)
            -> stop strings, output schema                            [postprocess]
            -> fallback on the declared triggers                      [failure policy]

The reference engine and the endpoint engine both call `admit` and use the same `ContractParts`, so the
six elements mean the same thing on either backend: a 121-token prompt is `input_too_long` under a 96-token
limit whether servegate's model or a vLLM server would have run it.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.contracts.field_checks import (
    SAMPLING_FIELDS,
    check_logprobs_offered,
    check_min_tokens,
    check_sampling,
    check_token_ids,
)
from servegate.contracts.manifest import ServedModel
from servegate.runtime.failure_policy.outcomes import on_arrival, overloaded, timeout_of
from servegate.runtime.postprocess import OutputValidator
from servegate.runtime.response_cache import ResponseCache
from servegate.runtime.types import GenerationRequest, PromptEncoder


@dataclass(frozen=True)
class AdmittedRequest:
    """A request the manifest accepts, as model input: tokens after truncation, limits and its deadline."""

    request: GenerationRequest
    token_ids: list[int]
    """Prompt tokens after the chat template and the truncation policy."""
    truncated_tokens: int
    """Prompt tokens dropped by the truncation policy (reported in usage, never hidden)."""
    max_tokens: int
    """Output tokens allowed: the request's, capped by postprocess.max_output_tokens and the context left."""
    stop: tuple[str, ...]
    """The request's stop strings, then the manifest's."""
    seed: int
    """The request's seed, else runtime.seed."""
    cache_salt: str
    """Salt of the prefix cache: the tenant when the cache is tenant-scoped, else empty (shared)."""
    arrival: float
    """time.monotonic() at arrival; the deadline counts from it."""
    timeout_s: float

    @property
    def deadline(self) -> float:
        """time.monotonic() past which the request fails with deadline_exceeded."""
        return self.arrival + self.timeout_s


def check_built_request(served: ServedModel, request: GenerationRequest, vocab_size: int) -> None:
    """Raise invalid_request, in the API's words, for what the API would refuse in a request built in code:
    sampling fields out of range, min_tokens past max_tokens, log-probabilities the manifest does not offer,
    token ids outside the vocabulary. (A max_tokens past postprocess.max_output_tokens is capped, not refused.)"""
    params = request.params
    check_sampling({name: getattr(params, name) for name in SAMPLING_FIELDS})
    check_min_tokens(params.min_tokens, params.max_tokens)
    if params.logprobs or params.top_logprobs > 0:
        check_logprobs_offered(served)
    named = {
        "prompt": request.prompt_token_ids or [],
        "logit_bias": [token for token, _ in params.logit_bias],
        "stop_token_ids": params.stop_token_ids,
    }
    check_token_ids(vocab_size, named)


def admit(served: ServedModel, preprocessor: PromptEncoder, request: GenerationRequest) -> AdmittedRequest:
    """Validate and encode a request as the manifest says (raises ServingError for a bad request): a request
    built from an API body was validated by parse_request, one built in code is checked here (check_built_request)."""
    if not request.from_api:
        check_built_request(served, request, preprocessor.vocab_size)
    encoded = preprocessor.encode(request)
    prompt = list(encoded.token_ids)
    room = served.runtime.max_model_len - len(prompt)
    if not prompt:
        raise ServingError("invalid_request", param="prompt", detail="the prompt is empty")
    if room < 1:
        raise ServingError("input_too_long", tokens=len(prompt), limit=served.runtime.max_model_len - 1)
    params = request.params
    kv = served.runtime.kv_cache
    salt = (request.tenant or "") if kv is None or kv.cache_scope == "tenant" else ""
    arrival = request.arrival_time if request.arrival_time is not None else time.monotonic()
    timeout = timeout_of(served.failure_policy, request.timeout_s)
    return AdmittedRequest(
        request=request,
        token_ids=prompt,
        truncated_tokens=encoded.truncated_tokens,
        max_tokens=min(params.max_tokens, served.postprocess.max_output_tokens, room),
        stop=tuple(dict.fromkeys((*params.stop, *served.postprocess.stop))),
        seed=params.seed if params.seed is not None else served.runtime.seed,
        cache_salt=salt,
        arrival=arrival,
        timeout_s=timeout,
    )


def salt_token(served: ServedModel, salt: str) -> str | None:
    """What a remote's prefix cache is salted with for a tenant: a hash, so the tenant id never leaves."""
    if not salt:
        return None
    return hashlib.sha256(f"{served.fingerprint}:{salt}".encode()).hexdigest()[:32]


@dataclass
class ContractParts:
    """The manifest's contract pieces an engine core is wrapped in."""

    preprocessor: PromptEncoder
    """Turns requests into prompt tokens (preprocess.Preprocessor, or one a caller gave)."""
    validator: OutputValidator | None
    """output_schema and max_output_bytes checker, when the manifest declares either."""
    response_cache: ResponseCache | None


def contract_parts(served: ServedModel, tokenizer: Any, preprocessor: PromptEncoder | None = None) -> ContractParts:
    """The preprocessor, output validator and response cache the manifest declares."""
    from servegate.runtime.preprocess import Preprocessor

    post = served.postprocess
    return ContractParts(
        preprocessor=preprocessor if preprocessor is not None else Preprocessor(served, tokenizer),
        validator=(
            OutputValidator(post.output_schema, post.max_output_bytes)
            if post.output_schema is not None or post.max_output_bytes is not None
            else None
        ),
        response_cache=ResponseCache(post.response_cache, served.fingerprint) if post.response_cache.enabled else None,
    )


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    granted: bool = False
    """Set under the queue's lock when a slot is handed over (the future learns it on its own loop)."""


class AdmissionQueue:
    """At most `slots` requests run at once; at most `max_queue` wait; beyond that the overload policy.

    For an engine core that does not schedule by itself here (a remote), this is the manifest's bounded
    queue: `batching.max_batch_size` requests in flight to the remote, `failure_policy.max_queue` waiting,
    and a full queue answered with `overloaded` (its status and Retry-After), rejecting the newest or
    shedding the oldest waiter. Safe across threads and event loops.
    """

    def __init__(self, served: ServedModel) -> None:
        self.policy = served.failure_policy
        self.slots = served.batching.max_batch_size
        self._lock = threading.Lock()
        self._running = 0
        self._waiting: deque[_Waiter] = deque()

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests holding a slot."""
        return self._running

    async def acquire(self, deadline: float) -> None:
        """Wait for a slot until `deadline` (raises overloaded when the queue is full, TimeoutError at it)."""
        with self._lock:
            if self._running < self.slots and not self._waiting:
                self._running += 1
                return
            arrival = on_arrival(self.policy, len(self._waiting), lambda: self._waiting[0] if self._waiting else None)
            if not arrival.admitted:
                raise overloaded(self.policy)
            if arrival.shed is not None:
                self._waiting.remove(arrival.shed)
                arrival.shed.loop.call_soon_threadsafe(_fail_future, arrival.shed.future, overloaded(self.policy))
            waiter = _Waiter(asyncio.get_running_loop(), asyncio.get_running_loop().create_future())
            self._waiting.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:
            with self._lock:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                elif waiter.granted:  # the slot came as the wait ended: pass it on
                    self._release_locked()
            raise

    def release(self) -> None:
        """Give a slot back: the oldest waiter gets it."""
        with self._lock:
            self._release_locked()

    def _release_locked(self) -> None:
        if self._waiting:
            waiter = self._waiting.popleft()
            waiter.granted = True  # the slot moves to the waiter: _running stays the same
            waiter.loop.call_soon_threadsafe(_grant_future, waiter.future)
        else:
            self._running -= 1


def _grant_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _fail_future(future: asyncio.Future[None], error: ServingError) -> None:
    if not future.done():
        future.set_exception(error)

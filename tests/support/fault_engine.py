"""A small deterministic engine for tests that must inject a fault (delay, crash, wrong output) into a server.

It follows the Engine protocol: a bounded queue with the manifest's overload policy, `batching.max_batch_size`
requests generating at once, the request deadline, `preprocess.max_input_tokens` with the truncation policy,
one character per token. Same prompt, seed and temperature: same text.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.types import (
    EngineStats,
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    Result,
    TokenEvent,
    Usage,
)
from support.fake_engine_base import FakeEngineBase

ALPHABET = "abcdefghij klmnopqrstuvwxyz"


@dataclass(frozen=True)
class FakeBehaviour:
    """Faults and timings to inject."""

    token_delay_s: float = 0.0
    """Seconds per generated token."""
    start_delay_s: float = 0.0
    """Seconds start() takes (model loading)."""
    crash_on: str = "CRASH-THE-ENGINE"
    """A prompt containing this makes submit() raise a plain exception (a server bug must become 500)."""
    hang_on: str = "HANG-THE-ENGINE"
    """A prompt containing this never gets an event (the server's own deadline must answer 504)."""
    slow_on: str = "SLOW-THE-ENGINE"
    """A prompt containing this takes 0.5 s per token (a stream that runs past its deadline)."""
    wrong_outputs: bool = False
    """Every greedy output is reversed (a broken deploy: warm-up must catch it)."""
    dim: int = 8
    """Embedding dimension."""


def prompt_text(request: GenerationRequest) -> str:
    """The text the model would see."""
    if request.messages is not None:
        return "".join(f"{m['role']}: {m['content']}\n" for m in request.messages) + "assistant: "
    if request.prompt_token_ids is not None:
        return "".join(ALPHABET[i % len(ALPHABET)] for i in request.prompt_token_ids)
    return request.prompt or ""


def fake_text(prompt: str, temperature: float, seed: int, length: int) -> str:
    """The deterministic output: greedy ignores the seed, sampling depends on it."""
    key = f"{prompt}|greedy" if temperature == 0 else f"{prompt}|{seed}|{temperature}"
    rng = random.Random(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest())
    return "".join(rng.choice(ALPHABET) for _ in range(length))


class FaultEngine(FakeEngineBase):
    """A deterministic Engine with the manifest's queue, concurrency, deadline and input limits (the protocol's
    other members: FakeEngineBase)."""

    preprocessor = None  # it has no tokenizer: token ids and logprob token names are not looked up

    def __init__(self, served: ServedModel, behaviour: FakeBehaviour | None = None) -> None:
        self.served = served
        self.behaviour = behaviour or FakeBehaviour()
        self._slots: asyncio.Semaphore | None = None
        self._waiting: list[asyncio.Future[None]] = []
        self._running = 0
        self.started = False

    async def start(self) -> None:
        """Pretend to load the model."""
        await asyncio.sleep(self.behaviour.start_delay_s)
        self._slots = asyncio.Semaphore(self.served.batching.max_batch_size)
        self.started = True

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Forget everything."""
        self.started = False

    def stats(self) -> EngineStats:
        """Queue depth and running sequences."""
        return EngineStats(queue_depth=len(self._waiting), running=self._running)

    async def embed(self, texts: Sequence[str], tenant: str | None = None) -> list[list[float]]:
        """A unit vector per text, derived from its hash."""
        vectors = []
        for text in texts:
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            raw = [b - 127.5 for b in digest[: self.behaviour.dim]]
            norm = math.sqrt(sum(v * v for v in raw)) or 1.0
            vectors.append([v / norm for v in raw])
        return vectors

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Result]:
        """Run requests one after another (only for completeness of the protocol)."""

        async def one(request: GenerationRequest) -> Result:
            result: Result | None = None
            async for event in self.submit(request):
                if isinstance(event, FinishEvent | ErrorEvent):
                    result = event
            assert result is not None
            return result

        async def run_all() -> list[Result]:
            if not self.started:
                await self.start()
            return [await one(r) for r in requests]

        return asyncio.run(run_all())

    async def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Queue, generate one character per token, finish; errors as ErrorEvents."""
        fail = self.served.failure_policy
        arrival = request.arrival_time or time.monotonic()
        deadline = arrival + (request.timeout_s or fail.request_timeout_s)
        prompt = prompt_text(request)
        if self.behaviour.crash_on in prompt:
            raise RuntimeError(f"engine crashed on {prompt!r}")
        if self.behaviour.hang_on in prompt:
            await asyncio.Event().wait()
        limit, truncated = self.served.preprocess.max_input_tokens, 0
        if len(prompt) > limit:
            if self.served.preprocess.truncation == "reject":
                param = "messages" if request.messages is not None else "prompt"
                error = ServingError("input_too_long", param=param, tokens=len(prompt), limit=limit)
                yield ErrorEvent(request.id, error)
                return
            truncated, prompt = len(prompt) - limit, prompt[-limit:]
        overload = ServingError("overloaded", retry_after=fail.retry_after_s, retry_after_s=fail.retry_after_s)
        if len(self._waiting) >= fail.max_queue:
            if fail.overload != "shed-oldest":
                yield ErrorEvent(request.id, overload)
                return
            oldest = self._waiting.pop(0)
            if not oldest.done():
                oldest.set_exception(overload)
        assert self._slots is not None, "start() first"
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(ticket)
        try:
            await asyncio.wait_for(self._admit(ticket), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:  # an alias of TimeoutError from Python 3.11 on
            yield ErrorEvent(request.id, ServingError("deadline_exceeded", timeout_s=fail.request_timeout_s))
            return
        except ServingError as error:
            yield ErrorEvent(request.id, error)
            return
        finally:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
        self._running += 1
        try:
            async for event in self._generate(request, prompt, truncated, arrival, deadline):
                yield event
        finally:
            self._running -= 1
            self._slots.release()

    async def _admit(self, ticket: asyncio.Future[None]) -> None:
        assert self._slots is not None
        acquire = asyncio.ensure_future(self._slots.acquire())
        done, _ = await asyncio.wait({acquire, ticket}, return_when=asyncio.FIRST_COMPLETED)
        if ticket in done and ticket.exception() is not None:  # shed while waiting
            if acquire.done() and not acquire.cancelled():
                self._slots.release()
            acquire.cancel()
            raise ticket.exception()  # type: ignore[misc]
        await acquire

    async def _generate(
        self, request: GenerationRequest, prompt: str, truncated: int, arrival: float, deadline: float
    ) -> AsyncIterator[Event]:
        params = request.params
        seed = params.seed if params.seed is not None else self.served.runtime.seed
        text = fake_text(prompt, params.temperature, seed, params.max_tokens)
        if self.behaviour.wrong_outputs:
            text = text[::-1] + "!"
        stops = tuple(params.stop) + tuple(self.served.postprocess.stop)
        cut = min((text.find(s) for s in stops if s in text), default=-1)
        reason = "stop" if cut >= 0 else "length"
        text = text[:cut] if cut >= 0 else text
        ttft = None
        delay = 0.5 if self.behaviour.slow_on in prompt else self.behaviour.token_delay_s
        for position, char in enumerate(text):
            if delay:
                await asyncio.sleep(delay)
            if time.monotonic() > deadline:
                yield ErrorEvent(request.id, ServingError("deadline_exceeded", timeout_s=deadline - arrival))
                return
            ttft = ttft if ttft is not None else time.monotonic() - arrival
            logprobs = (-0.25,) if params.logprobs else None
            yield TokenEvent(request.id, (position,), char, logprobs, time.monotonic())
        usage = Usage(prompt_tokens=len(prompt), completion_tokens=len(text), truncated_tokens=truncated)
        yield FinishEvent(
            request_id=request.id,
            text=text,
            token_ids=tuple(range(len(text))),
            finish_reason=reason,  # type: ignore[arg-type]
            usage=usage,
            logprobs=tuple(-0.25 for _ in text) if params.logprobs else None,
            top_logprobs=tuple({c: -0.25} for c in text) if params.top_logprobs else None,
            ttft_s=ttft,
            e2e_s=time.monotonic() - arrival,
        )

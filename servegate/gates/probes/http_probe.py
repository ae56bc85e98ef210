"""Timed completions over HTTP, for the audits that must work where servegate sees no internal counter.

The timing audits (audits/cache_audit.py, tenant_audit.py) see a deployment the way a client does: a request goes
out, an answer comes back, and only the clock and the response body are evidence. For the reference
backend and for an endpoint alike, the manifest is served by servegate's own app (the gateway that
`gate serve` runs) over an in-process ASGI transport, so the one code path times both; `HttpProbe` takes
any httpx client, so the same probes also run against a real server at a URL.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.gates.probes.contract_probes import tenant_fields, tenant_headers
from servegate.runtime.engine.interface import Engine

READY_TIMEOUT_S = 600.0
"""How long the in-process server may take to load its model and pass its warm-up."""


class ProbeError(ServegateError):
    """An audit request was refused or failed: the timing of an error says nothing about caches."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        """The error body's `code` (e.g. `invalid_output`), None when there was none."""


@dataclass(frozen=True)
class TimedAnswer:
    """One completion as the client saw it: wall time from send to the last byte, and what the body said."""

    seconds: float
    prompt_tokens: int
    completion_tokens: int
    cache: str | None
    """servegate's X-Servegate-Cache header (`hit`, `miss`, `partial`), None when the server sends none."""


def answers_checked(served: ServedModel) -> bool:
    """Whether the deployment judges each whole answer against an output contract (postprocess.output_schema or
    max_output_bytes): there an answer cut short, or run past its end-of-sequence, may be refused as invalid_output
    (HTTP 502), so the audits ask only for answers the contract can take, or time what goes out before it judges."""
    post = served.postprocess
    return post.output_schema is not None or post.max_output_bytes is not None


class HttpProbe:
    """Sends completion requests to a served manifest and times each one (non-streamed: the time to the last
    byte; with max_tokens 1 that is the time to the first token plus a constant; streamed: to the first event)."""

    def __init__(self, client: httpx.AsyncClient, served: ServedModel) -> None:
        self.client = client
        self.served = served

    def _request(
        self, prompt: str, max_tokens: int, seed: int, tenant: str | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A greedy completion body for `prompt` and the headers that name `tenant`."""
        body: dict[str, Any] = {
            "model": self.served.name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "seed": seed,
        }
        headers: dict[str, str] = {}
        if tenant is not None:
            headers = tenant_headers(self.served, tenant)
            body.update(tenant_fields(self.served, tenant))
        return body, headers

    async def complete(
        self, prompt: str, *, max_tokens: int, seed: int, tenant: str | None = None, ignore_eos: bool = False
    ) -> TimedAnswer:
        """POST /v1/completions greedily with `seed` (which changes the request, not the answer) as `tenant`;
        `ignore_eos` asks for exactly max_tokens tokens (vLLM's field, which servegate's API takes too)."""
        body, headers = self._request(prompt, max_tokens, seed, tenant)
        if ignore_eos:
            body["ignore_eos"] = True
        began = time.perf_counter()
        response = await self.client.post("/v1/completions", json=body, headers=headers)
        seconds = time.perf_counter() - began
        if response.status_code != 200:
            raise ProbeError(
                f"an audit request answered HTTP {response.status_code}: {response.text[:200]}", _error_code(response)
            )
        usage = response.json().get("usage") or {}
        return TimedAnswer(
            seconds,
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            response.headers.get("x-servegate-cache"),
        )

    async def first_token(self, prompt: str, *, seed: int, tenant: str | None = None) -> TimedAnswer:
        """Stream a greedy one-token completion as `tenant` and time it to its first event: the time to first token
        as a client sees it. An output contract judges the whole answer at its end, after that token went out, so a
        refusal there (invalid_output as the stream's last event) still leaves a timed first token; then no usage
        chunk follows and prompt_tokens is 0. Any other error, before or in the stream, raises ProbeError."""
        body, headers = self._request(prompt, 1, seed, tenant)
        body.update(stream=True, stream_options={"include_usage": True})
        first: float | None = None
        usage: dict[str, Any] = {}
        began = time.perf_counter()
        async with self.client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                raise ProbeError(
                    f"an audit stream answered HTTP {response.status_code}: {response.text[:200]}",
                    _error_code(response),
                )
            async for line in response.aiter_lines():
                data = line.removeprefix("data:").strip()
                if not line.startswith("data:") or data == "[DONE]":
                    continue
                first = first if first is not None else time.perf_counter()
                event = json.loads(data)
                error = event.get("error") if isinstance(event, dict) else None
                if error:
                    code = error.get("code") if isinstance(error, dict) else None
                    if code != "invalid_output":
                        raise ProbeError(f"an audit stream ended in an error: {data[:200]}", code)
                    break
                usage = event.get("usage") or usage
            cache = response.headers.get("x-servegate-cache")
        if first is None:
            raise ProbeError("an audit stream ended without an event")
        return TimedAnswer(
            first - began, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), cache
        )


def _error_code(response: httpx.Response) -> str | None:
    """The OpenAI-shaped error body's code, None when the body is not one."""
    try:
        code = (response.json().get("error") or {}).get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, str) else None


@asynccontextmanager
async def served_over_http(
    served: ServedModel, engine: Engine, *, owns_engine: bool = True
) -> AsyncIterator[HttpProbe]:
    """Serve `served` on `engine` with servegate's app in this process (start-up, warm-up and shutdown as
    `gate serve` runs them) and yield a probe that talks to it over an ASGI transport (`owns_engine=False`: the
    engine is left running at the end, for its owner to close)."""
    from servegate.server.app import create_app

    app = create_app(served, engine, grace_s=5.0, owns_engine=owns_engine)
    async with app.router.lifespan_context(app):
        state = app.state.serving
        end = time.monotonic() + READY_TIMEOUT_S
        while state.starting and time.monotonic() < end:
            await asyncio.sleep(0.02)
        if not state.ready:
            raise ProbeError(f"the audit server did not become ready: {state.not_ready_reason or 'timed out'}")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://servegate.audit", timeout=120.0) as client:
            yield HttpProbe(client, served)


def prompt_budget(served: ServedModel, max_tokens: int) -> int:
    """Most prompt tokens a request may carry and still be answered untruncated with `max_tokens` tokens."""
    return max(1, min(served.preprocess.max_input_tokens, served.runtime.max_model_len - max_tokens - 1))


def random_text(rng: random.Random, chars: int) -> str:
    """Lowercase words of 2-8 letters, `chars` characters long: text no earlier request shares a prefix with."""
    words: list[str] = []
    size = 0
    while size < chars:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8)))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:chars]


async def chars_per_token(
    probe: HttpProbe, rng: random.Random, tenant: str | None, count: Callable[[str], int] | None = None
) -> float:
    """How many characters of random_text make one prompt token on this deployment (one calibration request): by
    the server's count, else (an answer the output contract refused carries none) by `count`, the manifest's
    tokenizer; else 1, the fewest any tokenizer makes of lowercase words (prompts then fall short, never over)."""
    sample = random_text(rng, 64)
    answer = await probe.first_token(sample, seed=rng.randrange(2**31), tenant=tenant)
    tokens = answer.prompt_tokens or (count(sample) if count is not None else len(sample))
    return len(sample) / max(1, tokens)

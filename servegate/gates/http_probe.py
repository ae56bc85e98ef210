"""Timed completions over HTTP, for the audits that must work where servegate sees no internal counter.

The timing audits (cache_audit.py, tenant_audit.py) see a deployment the way a client does: a request goes
out, an answer comes back, and only the clock and the response body are evidence. For the reference
backend and for an endpoint alike, the manifest is served by servegate's own app (the gateway that
`gate serve` runs) over an in-process ASGI transport, so the one code path times both; `HttpProbe` takes
any httpx client, so the same probes also run against a real server at a URL.
"""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.gates.contract_probes import tenant_fields, tenant_headers
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


class HttpProbe:
    """Sends completion requests to a served manifest and times each one (non-streamed: the time to the last
    byte; with max_tokens 1 that is the time to the first token plus a constant)."""

    def __init__(self, client: httpx.AsyncClient, served: ServedModel) -> None:
        self.client = client
        self.served = served

    async def complete(
        self, prompt: str, *, max_tokens: int, seed: int, tenant: str | None = None, ignore_eos: bool = False
    ) -> TimedAnswer:
        """POST /v1/completions greedily with `seed` (which changes the request, not the answer) as `tenant`;
        `ignore_eos` asks for exactly max_tokens tokens (vLLM's field, which servegate's API takes too)."""
        body: dict[str, Any] = {
            "model": self.served.name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "seed": seed,
        }
        if ignore_eos:
            body["ignore_eos"] = True
        headers: dict[str, str] = {}
        if tenant is not None:
            headers = tenant_headers(self.served, tenant)
            body.update(tenant_fields(self.served, tenant))
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


def _error_code(response: httpx.Response) -> str | None:
    """The OpenAI-shaped error body's code, None when the body is not one."""
    try:
        code = (response.json().get("error") or {}).get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, str) else None


@asynccontextmanager
async def served_over_http(served: ServedModel, engine: Engine) -> AsyncIterator[HttpProbe]:
    """Serve `served` on `engine` with servegate's app in this process (start-up, warm-up and shutdown as
    `gate serve` runs them) and yield a probe that talks to it over an ASGI transport."""
    from servegate.server.app import create_app

    app = create_app(served, engine, grace_s=5.0)
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


async def chars_per_token(probe: HttpProbe, rng: random.Random, tenant: str | None) -> float:
    """How many characters of random_text make one prompt token on this deployment (one calibration request)."""
    sample = random_text(rng, 64)
    answer = await probe.complete(sample, max_tokens=1, seed=rng.randrange(2**31), tenant=tenant)
    return len(sample) / max(1, answer.prompt_tokens)

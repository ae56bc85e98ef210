"""What the bench sends requests to: any OpenAI-compatible HTTP server, or an Engine in this process.

A target fills a RequestRecord: the arrival time of each streamed chunk, the end, the token counts
and any error. Times are `time.perf_counter()` seconds, the clock the bench schedules with.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
import time
from typing import Any, Protocol

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.sse_client import HttpStatusError, SSEClient
from servegate.capacity.bench.workload import RequestSpec

_WORDS = string.ascii_lowercase


class PromptFactory:
    """Prompt texts of a requested token length.

    With a tokenizer the text is cut to exactly the requested number of tokens (special tokens included);
    without one, `chars_per_token` characters per token are sent and the server's usage gives the count.
    """

    def __init__(self, tokenizer: Any | None = None, chars_per_token: float = 4.0, seed: int | None = None) -> None:
        self.tokenizer: Any = tokenizer  # a Hugging Face tokenizer (untyped), or None
        self.chars_per_token = chars_per_token
        # No seed: fresh text on every run, so a server's response or prefix cache that outlives one bench
        # run never answers the next (arrivals and lengths stay reproducible through the workload's seed).
        self._rng = random.Random(seed)

    def _filler(self, n_chars: int) -> str:
        words: list[str] = []
        length = 0
        while length < n_chars:
            word = "".join(self._rng.choice(_WORDS) for _ in range(self._rng.randint(2, 7)))
            words.append(word)
            length += len(word) + 1
        return " ".join(words)[:n_chars]

    def _count(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def text(self, tokens: int) -> str:
        """A fresh prompt of about `tokens` tokens (exactly, when a tokenizer was given).

        Every call returns different text, so neither a response cache nor a prefix cache can serve it.
        """
        if self.tokenizer is None:
            return self._filler(max(1, round(tokens * self.chars_per_token)))
        base = self._filler(max(8, tokens * 2))
        while self._count(base) <= tokens:  # grow until the text holds more than `tokens` tokens
            base += " " + self._filler(len(base))
        lo, hi = 1, len(base)  # binary search the longest prefix with <= tokens tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._count(base[:mid]) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        return base[:lo]


class BenchTarget(Protocol):
    """Something the bench can send one streamed completion to."""

    async def send(self, spec: RequestSpec, prompt: str, record: RequestRecord) -> None:
        """Send one request and record its timeline into `record` (never raises for request errors)."""

    async def aclose(self) -> None:
        """Release connections."""


class HttpTarget:
    """An OpenAI-compatible server: POST {base}/completions with stream=true, read server-sent events.

    `ignore_eos` and `stream_options.include_usage` are sent when the server accepts them (`probe`
    finds out), so outputs have the requested length and the token count comes from the server.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        self.url = base + ("/completions" if base.endswith("/v1") else "/v1/completions")
        self.model = model
        sent = dict(headers or {})
        if api_key:
            sent["Authorization"] = f"Bearer {api_key}"
        self.client = SSEClient(self.url.rsplit("/completions", 1)[0], sent)
        self.extras: dict[str, Any] = {"ignore_eos": True, "stream_options": {"include_usage": True}}
        if user:
            self.extras["user"] = user

    @classmethod
    def for_manifest(
        cls, base_url: str, served: Any, tenant: str = "bench", headers: dict[str, str] | None = None
    ) -> HttpTarget:
        """A target sending what the manifest's server expects: its model name and, when it reads one, a tenant
        (`headers` are sent as well, and win over the tenant header)."""
        model = served.runtime.endpoint_model or served.name
        tenant_from = served.preprocess.tenant_from
        sent = {"X-Tenant": tenant} if tenant_from == "header" else {}
        return cls(base_url, model, headers={**sent, **(headers or {})}, user=tenant if tenant_from == "user" else None)

    @property
    def ignore_eos(self) -> bool:
        """Whether outputs are asked to run to max_tokens (the server accepted `ignore_eos` in the probe)."""
        return "ignore_eos" in self.extras

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The JSON body of one streamed completion request."""
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0.0}
        if self.model:
            body["model"] = self.model
        return {**body, **self.extras}

    async def probe(self) -> None:
        """Send one small request; drop optional fields the server refuses (400), fail on anything else."""
        for _ in range(len(self.extras) + 1):
            record = RequestRecord(scheduled=time.perf_counter())
            await self.send(RequestSpec(4, 2, 0.0), "probe", record)
            if record.ok:
                return
            refused = [k for k in self.extras if k != "user" and record.error and k in record.error]
            if not refused:
                raise ConnectionError(f"{self.url}: the probe request failed: {record.error}")
            for key in refused:
                self.extras.pop(key)
        raise ConnectionError(f"{self.url}: the probe request failed")

    async def send(self, spec: RequestSpec, prompt: str, record: RequestRecord) -> None:
        """Stream one completion, stamping each chunk that carries output on arrival."""
        chunks = 0

        def on_event(data: str, now: float) -> bool:
            nonlocal chunks
            if data == "[DONE]":
                return True
            event = json.loads(data)
            if record.request_id is None and isinstance(event.get("id"), str):
                record.request_id = event["id"]
            if "error" in event:
                error = event["error"]
                record.error = str(error.get("code") or error) if isinstance(error, dict) else str(error)
                record.error_class = f"stream error {record.error[:60]}"
                return True
            choices = event.get("choices") or []
            if choices and (choices[0].get("text") or (choices[0].get("delta") or {}).get("content")):
                record.token_times.append(now)
                chunks += 1
            usage = event.get("usage")
            if usage:
                record.usage_output_tokens = int(usage.get("completion_tokens") or 0)
                record.usage_prompt_tokens = int(usage.get("prompt_tokens") or 0)
                record.output_tokens = record.usage_output_tokens
                record.prompt_tokens = record.usage_prompt_tokens
            return False

        body = json.dumps(self.body(prompt, spec.output_tokens)).encode()
        record.requested_prompt_tokens, record.requested_output_tokens = spec.prompt_tokens, spec.output_tokens
        try:
            record.sent = time.perf_counter()
            await self.client.post_events("/completions", body, on_event)
        except (HttpStatusError, OSError, asyncio.IncompleteReadError, json.JSONDecodeError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            record.error_class = error_class(exc)
            return
        finally:
            record.chunks = chunks
        if record.error is None:
            record.end = time.perf_counter()
            if record.output_tokens == 0:
                record.output_tokens = chunks

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()


def error_class(exc: Exception) -> str:
    """A short name to count failures by: `HTTP 400 context_length_exceeded`, `ConnectionRefusedError`, ..."""
    if isinstance(exc, HttpStatusError):
        code = ""
        try:
            error = json.loads(exc.body).get("error")
            if isinstance(error, dict):
                code = str(error.get("code") or error.get("type") or "")
            elif isinstance(error, str):
                code = error[:60]
        except (json.JSONDecodeError, AttributeError):
            pass
        return f"HTTP {exc.status}" + (f" {code}" if code else "")
    return type(exc).__name__


class EngineTarget:
    """An Engine in this process (no HTTP): for profiling and for checking the simulator against the runtime."""

    in_process = True
    """Shares the interpreter with the bench: the bench must not spin while waiting to send."""
    ignore_eos = True
    """Every request runs to its max_tokens."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._next = 0

    async def send(self, spec: RequestSpec, prompt: str, record: RequestRecord) -> None:
        """Submit one request and stamp each TokenEvent as it is received."""
        from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams, TokenEvent

        self._next += 1
        request = GenerationRequest(
            id=f"bench-{self._next}",
            prompt=prompt,
            params=SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True),
            arrival_time=time.monotonic() - (time.perf_counter() - record.scheduled),
        )
        record.requested_prompt_tokens, record.requested_output_tokens = spec.prompt_tokens, spec.output_tokens
        record.request_id = request.id
        record.sent = time.perf_counter()
        try:
            async for event in self.engine.submit(request):
                now = time.perf_counter()
                if isinstance(event, TokenEvent) and (event.token_ids or event.text):
                    record.token_times.append(now)
                    record.chunks += 1
                elif isinstance(event, FinishEvent):
                    record.end = now
                    record.output_tokens = record.usage_output_tokens = event.usage.completion_tokens
                    record.prompt_tokens = record.usage_prompt_tokens = event.usage.prompt_tokens
                elif isinstance(event, ErrorEvent):
                    record.error = record.error_class = event.error.code
        except Exception as exc:  # an engine bug must show as a failed request, not stop the run
            record.error = f"{type(exc).__name__}: {exc}"
            record.error_class = type(exc).__name__

    async def aclose(self) -> None:
        """Nothing to release (the caller owns the engine)."""

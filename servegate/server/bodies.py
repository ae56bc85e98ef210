"""Build the OpenAI-shaped response bodies from the engine's events (see servegate.contracts.responses)."""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Sequence
from typing import Any

from servegate.contracts import logprob_bodies
from servegate.contracts.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionResponse,
    EmbeddingItem,
    EmbeddingResponse,
    EmbeddingUsage,
    FinishReason,
    PromptTokensDetails,
    UsageBody,
)
from servegate.runtime.engine.interface import FinishEvent, TokenEvent, Usage


def finish_reason(event: FinishEvent) -> FinishReason:
    """OpenAI's finish reason: EOS and stop strings are both `stop`."""
    return "length" if event.finish_reason == "length" else "stop"


def usage_body(usage: Usage) -> UsageBody:
    """The usage object, with the truncated prompt tokens shown."""
    return UsageBody(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        truncated_tokens=usage.truncated_tokens,
        prompt_tokens_details=None
        if usage.cached_tokens is None
        else PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def _alternatives(event: FinishEvent) -> list[dict[str, float]] | None:
    """The top alternatives per token, None when the request asked for none."""
    return [dict(t) for t in event.top_logprobs] if event.top_logprobs is not None else None


def completion_logprobs(event: FinishEvent, tokens: Sequence[str]) -> dict[str, Any] | None:
    """The completions API's logprobs object, {tokens, token_logprobs, top_logprobs, text_offset}."""
    if event.logprobs is None:
        return None
    return logprob_bodies.completion_logprobs(tokens, event.logprobs, _alternatives(event))


def chat_logprobs(event: FinishEvent, tokens: Sequence[str]) -> dict[str, Any] | None:
    """The chat API's logprobs object, {content: [{token, logprob, bytes, top_logprobs}]}."""
    if event.logprobs is None:
        return None
    return logprob_bodies.chat_logprobs(tokens, event.logprobs, _alternatives(event))


def total_usage(usages: Sequence[Usage], n: int) -> Usage:
    """The usage of a request's choices: each prompt's tokens counted once (choices i*n..i*n+n-1 share one)."""
    firsts = usages[::n]
    return Usage(
        prompt_tokens=sum(u.prompt_tokens for u in firsts),
        completion_tokens=sum(u.completion_tokens for u in usages),
        truncated_tokens=sum(u.truncated_tokens for u in firsts),
        cached_tokens=_total_cached(firsts),
    )


def _total_cached(usages: Sequence[Usage]) -> int | None:
    """Prefix-cache hits of the prompts, None when any usage has none to say (no prefix cache declared)."""
    counts = [u.cached_tokens for u in usages]
    return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


Choice = tuple[FinishEvent, Sequence[str]]
"""A finished choice and the text of each of its tokens (for logprobs)."""


class BodyBuilder:
    """Builds the bodies of one request (same id, time and fingerprint in every chunk)."""

    def __init__(self, request_id: str, model: str, fingerprint: str, n: int = 1) -> None:
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        self.fingerprint = fingerprint[:16]
        self.n = n
        """Choices per prompt (usage counts each prompt once)."""
        self.cache: str | None = None
        """`hit`, `miss` or `partial` once known; None when no response cache is declared."""

    def completion(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """The whole non-streamed completion, one choice per engine request, in index order."""
        bodies = [
            CompletionChoice(
                index=i,
                text=event.text,
                finish_reason=finish_reason(event),
                logprobs=completion_logprobs(event, tokens),
            )
            for i, (event, tokens) in enumerate(choices)
        ]
        usage = usage_body(total_usage([event.usage for event, _ in choices], self.n))
        return self._dump(CompletionResponse(**self._head(), choices=bodies, usage=usage))

    def chat(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """The whole non-streamed chat completion."""
        bodies = [
            ChatChoice(
                index=i,
                message=AssistantMessage(content=event.text),
                finish_reason=finish_reason(event),
                logprobs=chat_logprobs(event, tokens),
            )
            for i, (event, tokens) in enumerate(choices)
        ]
        usage = usage_body(total_usage([event.usage for event, _ in choices], self.n))
        return self._dump(ChatCompletionResponse(**self._head(), choices=bodies, usage=usage))

    def completion_chunk(
        self, text: str, reason: FinishReason | None = None, index: int = 0, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One streamed completion chunk of choice `index` (with its tokens' logprobs object when asked for)."""
        choice = CompletionChoice(index=index, text=text, finish_reason=reason, logprobs=logprobs)
        return self._dump(CompletionResponse(**self._head(), choices=[choice]))

    def chat_chunk(
        self,
        delta: ChatDelta,
        reason: FinishReason | None = None,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One streamed chat chunk of choice `index` (with its tokens' logprobs object when asked for)."""
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=reason, logprobs=logprobs)
        body = self._dump(ChatCompletionChunk(**self._head(), choices=[choice]))
        body["choices"][0]["delta"] = delta.model_dump(mode="json", exclude_none=True)  # OpenAI omits unset keys
        return body

    def usage_chunk(self, chat: bool, usages: Sequence[Usage]) -> dict[str, Any]:
        """The last chunk of a stream with stream_options.include_usage: no choices, the usage of all."""
        cls = ChatCompletionChunk if chat else CompletionResponse
        return self._dump(cls(**self._head(), choices=[], usage=usage_body(total_usage(usages, self.n))))

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "response_cache": self.cache,
        }

    @staticmethod
    def _dump(body: Any) -> dict[str, Any]:
        return body.model_dump(mode="json")


def embeddings_body(
    model: str, vectors: Sequence[Sequence[float]], encoding: str, prompt_tokens: int
) -> dict[str, Any]:
    """The embeddings response; base64 is little-endian float32, as OpenAI clients decode it."""
    items = []
    for index, vector in enumerate(vectors):
        if encoding == "base64":
            packed = struct.pack(f"<{len(vector)}f", *vector)
            items.append(EmbeddingItem(index=index, embedding=base64.b64encode(packed).decode("ascii")))
        else:
            items.append(EmbeddingItem(index=index, embedding=[float(v) for v in vector]))
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return EmbeddingResponse(data=items, model=model, usage=usage).model_dump(mode="json")


def token_texts(events: Sequence[TokenEvent]) -> list[str]:
    """The text of each generated token, when each event carries exactly one token (else one entry per event)."""
    texts: list[str] = []
    for event in events:
        if len(event.token_ids) == 1:
            texts.append(event.text)
        else:
            texts.extend([event.text] + [""] * (len(event.token_ids) - 1))
    return texts

"""Build the OpenAI-shaped response bodies from the engine's events (see servegate.contracts.responses)."""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from collections.abc import Sequence
from typing import Any

from servegate.contracts import logprob_bodies
from servegate.contracts.responses import (
    ANSWERED_ONLY_WHEN_ASKED,
    ANSWERED_WITH_TOKEN_IDS,
    AssistantMessage,
    CalledFunctionBody,
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
    ToolCallBody,
    ToolCallDelta,
    UsageBody,
)
from servegate.contracts.tool_fields import ToolUse
from servegate.runtime.tool_calls import ToolReading, read_tool_calls
from servegate.runtime.types import FinishEvent, TokenEvent, Usage


def finish_reason(event: FinishEvent, reading: ToolReading | None = None, tools: ToolUse | None = None) -> FinishReason:
    """OpenAI's finish reason: EOS and stop strings are both `stop`; an output that called tools under tool_choice
    auto or required is `tool_calls` (a named choice stays `stop`, as in OpenAI's API and vLLM)."""
    if event.finish_reason == "length":
        return "length"
    if reading is not None and reading.calls and tools is not None and tools.mode != "named":
        return "tool_calls"
    return "stop"


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

    def __init__(
        self,
        request_id: str,
        model: str,
        fingerprint: str,
        n: int = 1,
        tools: ToolUse | None = None,
        token_ids: bool = False,
    ) -> None:
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        self.fingerprint = fingerprint[:16]
        self.n = n
        """Choices per prompt (usage counts each prompt once)."""
        self.cache: str | None = None
        """`hit`, `miss` or `partial` once known; None when no response cache is declared."""
        self.tools = tools
        """What a chat answer is read for (None: plain text)."""
        self.token_ids = token_ids
        """Each choice carries its token ids (vLLM's return_token_ids)."""

    def completion(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """The whole non-streamed completion, one choice per engine request, in index order."""
        bodies = [
            CompletionChoice(
                index=i,
                text=event.text,
                finish_reason=finish_reason(event),
                logprobs=completion_logprobs(event, tokens),
                token_ids=self.ids(event.token_ids),
            )
            for i, (event, tokens) in enumerate(choices)
        ]
        usage = usage_body(total_usage([event.usage for event, _ in choices], self.n))
        return self._dump(CompletionResponse(**self._head(), choices=bodies, usage=usage))

    def chat(self, choices: Sequence[Choice]) -> dict[str, Any]:
        """The whole non-streamed chat completion."""
        bodies = []
        for i, (event, tokens) in enumerate(choices):
            reading = self.reading(event)
            message = AssistantMessage(content=event.text)
            if reading is not None:
                calls = [ToolCallBody(id=self.call_id(i, k), function=f) for k, f in enumerate(_functions(reading))]
                message = AssistantMessage(content=reading.content, tool_calls=calls or None)
            reason = finish_reason(event, reading, self.tools)
            logprobs = chat_logprobs(event, tokens)
            ids = self.ids(event.token_ids)
            bodies.append(ChatChoice(index=i, message=message, finish_reason=reason, logprobs=logprobs, token_ids=ids))
        usage = usage_body(total_usage([event.usage for event, _ in choices], self.n))
        body = self._dump(ChatCompletionResponse(**self._head(), choices=bodies, usage=usage))
        for choice in body["choices"]:
            if choice["message"]["tool_calls"] is None:  # OpenAI leaves the key out of a message without calls
                del choice["message"]["tool_calls"]
        return body

    def reading(self, event: FinishEvent) -> ToolReading | None:
        """The content and tool calls of a finished chat answer (None: the request offers no tools to call; an
        answer cut at max_tokens is read as text)."""
        if self.tools is None:
            return None
        if event.finish_reason == "length":
            return ToolReading(event.text)
        return read_tool_calls(self.tools, event.text)

    def call_id(self, choice: int, call: int) -> str:
        """The id of a choice's call: from the request id, so a replayed answer names its calls the same."""
        digest = hashlib.sha256(f"{self.id}/{choice}/{call}".encode()).hexdigest()
        return f"call_{digest[:24]}"

    def tool_call_deltas(self, reading: ToolReading, choice: int) -> list[ToolCallDelta]:
        """A stream's tool calls of one choice, each whole."""
        functions = _functions(reading)
        return [ToolCallDelta(index=k, id=self.call_id(choice, k), function=f) for k, f in enumerate(functions)]

    def ids(self, token_ids: Sequence[int]) -> list[int] | None:
        """A choice's (or a chunk's) `token_ids` as the body carries them: None unless return_token_ids asks."""
        return [int(t) for t in token_ids] if self.token_ids else None

    def completion_chunk(
        self,
        text: str,
        reason: FinishReason | None = None,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        token_ids: Sequence[int] = (),
    ) -> dict[str, Any]:
        """One streamed completion chunk of choice `index` (with its tokens' logprobs object when asked for, and
        the ids of the tokens it delivers when return_token_ids asks)."""
        ids = self.ids(token_ids)
        choice = CompletionChoice(index=index, text=text, finish_reason=reason, logprobs=logprobs, token_ids=ids)
        return self._dump(CompletionResponse(**self._head(), choices=[choice]))

    def chat_chunk(
        self,
        delta: ChatDelta,
        reason: FinishReason | None = None,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        token_ids: Sequence[int] = (),
    ) -> dict[str, Any]:
        """One streamed chat chunk of choice `index` (with its tokens' logprobs object when asked for, and the ids
        of the tokens it delivers when return_token_ids asks)."""
        ids = self.ids(token_ids)
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=reason, logprobs=logprobs, token_ids=ids)
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

    def _dump(self, body: Any) -> dict[str, Any]:
        left_out = ANSWERED_WITH_TOKEN_IDS if self.token_ids else ANSWERED_ONLY_WHEN_ASKED
        return body.model_dump(mode="json", exclude=left_out)


def _functions(reading: ToolReading) -> list[CalledFunctionBody]:
    return [CalledFunctionBody(name=call.name, arguments=call.arguments) for call in reading.calls]


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

"""The response contract of the OpenAI-compatible API: bodies, stream chunks, embeddings and errors.

Field names and shapes follow the OpenAI API so unmodified clients parse them. Two additions, both
optional for clients: `usage.truncated_tokens` (prompt tokens dropped by the truncation policy, never
hidden), `system_fingerprint` (the manifest's fingerprint, so a response names the behaviour that made it)
and `response_cache` (`hit` when the response cache answered, also in the X-Servegate-Cache header).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from servegate.contracts.requests import Endpoint


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class PromptTokensDetails(_Body):
    """What the prompt's tokens cost: how many came from the KV prefix cache (OpenAI's field)."""

    cached_tokens: int = Field(ge=0)
    """Prompt tokens read from the prefix cache instead of computed."""


class UsageBody(_Body):
    """Token counts of one request."""

    prompt_tokens: int = Field(ge=0)
    """Tokens of the prompt the model saw (after truncation)."""
    completion_tokens: int = Field(default=0, ge=0)
    """Tokens generated."""
    total_tokens: int = Field(ge=0)
    """prompt_tokens + completion_tokens."""
    truncated_tokens: int = Field(default=0, ge=0)
    """Prompt tokens dropped by preprocess.truncation (0 when nothing was dropped)."""
    prompt_tokens_details: PromptTokensDetails | None = None
    """Prefix-cache hits of the prompt; null when the manifest declares no prefix cache."""


FinishReason = Literal["stop", "length", "tool_calls"]
CacheState = Literal["hit", "miss", "partial"]


class PromptTokenLogprob(_Body):
    """One token at one prompt position (vLLM's Logprob)."""

    logprob: float
    """log p(token | the prompt tokens before it), in nats."""
    rank: int | None
    """The token's rank in the vocabulary there (1: the likeliest); null where the engine does not say."""
    decoded_token: str
    """The token's text (`token_id:<id>` with return_tokens_as_token_ids)."""


ANSWERED_ONLY_WHEN_ASKED = {"prompt_logprobs": True, "choices": {"__all__": {"prompt_logprobs", "token_ids"}}}
"""Fields a body carries only when the request asks for them (server/prompt_logprobs.py adds prompt_logprobs;
server/bodies.py keeps token_ids when return_token_ids asks for them)."""
ANSWERED_WITH_TOKEN_IDS = {"prompt_logprobs": True, "choices": {"__all__": {"prompt_logprobs"}}}
"""What a body leaves out when the request asks for return_token_ids (the choices' token_ids are kept)."""


class CompletionChoice(_Body):
    """One choice of a completion (or one chunk's part of it)."""

    index: int = 0
    """Choice index: prompt i's j-th choice is i * n + j (chunks of a stream say which choice they extend)."""
    text: str
    """Generated text (in a chunk: the text since the previous chunk)."""
    finish_reason: FinishReason | None = None
    """`stop` (EOS or a stop string), `length` (max_tokens reached); null until the last chunk."""
    logprobs: dict[str, Any] | None = None
    """{tokens, token_logprobs, top_logprobs, text_offset} when asked for."""
    token_ids: list[int] | None = None
    """vLLM: the ids of the tokens generated, an end-of-sequence or stop token included (as many as
    usage.completion_tokens counts); in a stream chunk, the ids of the tokens it delivers. Only when the request
    asks for return_token_ids."""
    prompt_logprobs: list[dict[str, PromptTokenLogprob] | None] | None = None
    """vLLM: per prompt token (null for the first), {token id: its logprob, rank and text}, the prompt's own
    token first, then the likeliest alternatives; only when the request asks for prompt_logprobs."""


class CompletionResponse(_Body):
    """Body of POST /v1/completions, and of each of its stream chunks."""

    id: str
    """Request id (also in the X-Request-Id header)."""
    object: Literal["text_completion"] = "text_completion"
    """Object type."""
    created: int
    """Unix time in seconds."""
    model: str
    """The served model's name."""
    choices: list[CompletionChoice]
    """The choices in index order (a chunk: the one it extends; empty in the usage-only last chunk)."""
    usage: UsageBody | None = None
    """Token counts (in a stream: only in the last chunk, when stream_options.include_usage)."""
    system_fingerprint: str | None = None
    """The manifest's fingerprint (first 16 hex digits)."""
    response_cache: CacheState | None = None
    """servegate extension: `hit` (every choice replayed from postprocess.response_cache), `miss`, or `partial`;
    null when the manifest declares no response cache. The X-Servegate-Cache header says the same."""


class CalledFunctionBody(_Body):
    """The function a tool call calls."""

    name: str
    """One of the request's tools."""
    arguments: str
    """The arguments object as JSON text."""


class ToolCallBody(_Body):
    """One tool call of the generated message."""

    id: str
    """The call's id (send it back as a `tool` message's tool_call_id)."""
    type: Literal["function"] = "function"
    """Always `function`."""
    function: CalledFunctionBody
    """What is called."""


class AssistantMessage(_Body):
    """The generated chat message."""

    role: Literal["assistant"] = "assistant"
    """Always `assistant`."""
    content: str | None
    """Generated text (null when the message is only tool calls)."""
    tool_calls: list[ToolCallBody] | None = None
    """The calls the model made, read by the manifest's postprocess.tools.parser (absent: none)."""


class ChatChoice(_Body):
    """The choice of a chat completion."""

    index: int = 0
    """Choice index (0 to n - 1)."""
    message: AssistantMessage
    """The generated message."""
    finish_reason: FinishReason
    """`stop`, `length`, or `tool_calls` (the model called tools under tool_choice auto or required)."""
    logprobs: dict[str, Any] | None = None
    """{content: [{token, logprob, bytes, top_logprobs}]} when asked for."""
    token_ids: list[int] | None = None
    """vLLM: the ids of the tokens generated, an end-of-sequence or stop token included (as many as
    usage.completion_tokens counts). Only when the request asks for return_token_ids."""


class ChatCompletionResponse(_Body):
    """Body of POST /v1/chat/completions."""

    id: str
    """Request id."""
    object: Literal["chat.completion"] = "chat.completion"
    """Object type."""
    created: int
    """Unix time in seconds."""
    model: str
    """The served model's name."""
    choices: list[ChatChoice]
    """The n choices, in index order."""
    usage: UsageBody
    """Token counts."""
    prompt_logprobs: list[dict[str, PromptTokenLogprob] | None] | None = None
    """vLLM: the rendered prompt's tokens as in a completion choice's prompt_logprobs (only when asked for)."""
    system_fingerprint: str | None = None
    """The manifest's fingerprint (first 16 hex digits)."""
    response_cache: CacheState | None = None
    """servegate extension: `hit` (every choice replayed from postprocess.response_cache), `miss`, or `partial`;
    null when the manifest declares no response cache. The X-Servegate-Cache header says the same."""


class ToolCallDelta(_Body):
    """A tool call in a stream chunk, in OpenAI's delta shape (servegate sends each call whole, once)."""

    index: int
    """The call's position among the message's calls."""
    id: str
    """The call's id."""
    type: Literal["function"] = "function"
    """Always `function`."""
    function: CalledFunctionBody
    """Its name and whole arguments."""


class ChatDelta(_Body):
    """What a chat stream chunk adds to the message."""

    role: Literal["assistant"] | None = None
    """Sent once, in the first chunk."""
    content: str | None = None
    """Text since the previous chunk."""
    tool_calls: list[ToolCallDelta] | None = None
    """Tool calls, each whole in one chunk, after the content."""


class ChatChunkChoice(_Body):
    """The choice part of a chat stream chunk."""

    index: int = 0
    """Index of the choice this chunk extends."""
    delta: ChatDelta
    """The addition."""
    finish_reason: FinishReason | None = None
    """Set in the last content chunk."""
    logprobs: dict[str, Any] | None = None
    """Log-probabilities of this chunk's tokens when asked for."""
    token_ids: list[int] | None = None
    """vLLM: the ids of the tokens this chunk delivers (the chunks' ids add up to every token generated, as
    usage.completion_tokens counts them). Only when the request asks for return_token_ids."""


class ChatCompletionChunk(_Body):
    """One server-sent event of a streamed chat completion."""

    id: str
    """Request id (the same in every chunk)."""
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    """Object type."""
    created: int
    """Unix time in seconds."""
    model: str
    """The served model's name."""
    choices: list[ChatChunkChoice]
    """The choice part (empty in the usage-only last chunk)."""
    usage: UsageBody | None = None
    """Token counts, only in the last chunk when stream_options.include_usage."""
    system_fingerprint: str | None = None
    """The manifest's fingerprint (first 16 hex digits)."""
    response_cache: CacheState | None = None
    """servegate extension: `hit` (every choice replayed from postprocess.response_cache), `miss`, or `partial`;
    null when the manifest declares no response cache. The X-Servegate-Cache header says the same."""


class EmbeddingItem(_Body):
    """One embedding vector."""

    object: Literal["embedding"] = "embedding"
    """Object type."""
    index: int
    """Position of the input this vector belongs to."""
    embedding: list[float] | str
    """The vector: numbers, or base64 of little-endian float32 when encoding_format is base64."""


class EmbeddingUsage(_Body):
    """Token counts of an embeddings request."""

    prompt_tokens: int = Field(ge=0)
    """Tokens over all inputs."""
    total_tokens: int = Field(ge=0)
    """Same as prompt_tokens."""


class EmbeddingResponse(_Body):
    """Body of POST /v1/embeddings."""

    object: Literal["list"] = "list"
    """Object type."""
    data: list[EmbeddingItem]
    """One vector per input, in input order."""
    model: str
    """The served model's name."""
    usage: EmbeddingUsage
    """Token counts."""


class ErrorDetail(_Body):
    """The error object of an error body (see servegate.contracts.errors.CATALOGUE for every code)."""

    message: str
    """What went wrong and what to change."""
    type: str
    """OpenAI error type (invalid_request_error, rate_limit_error, server_error, timeout_error)."""
    code: str
    """The catalogue code."""
    param: str | None = None
    """The request field at fault, as a JSON path (`messages[0].content`), when one is."""


class ErrorBody(_Body):
    """Body of every error response."""

    error: ErrorDetail
    """The error."""


class AsyncStatus(_Body):
    """Body of 202 Accepted for `Prefer: respond-async`, and of polling a request that has not finished."""

    id: str
    """Request id; poll GET /v1/requests/{id}."""
    object: Literal["request"] = "request"
    """Object type."""
    status: Literal["queued", "in_progress"]
    """Where the request is."""
    endpoint: Endpoint
    """The endpoint the request was sent to."""


class ModelCard(_Body):
    """One entry of GET /v1/models."""

    id: str
    """The served model's name (send it as `model`)."""
    object: Literal["model"] = "model"
    """Object type."""
    created: int
    """Unix time the server started."""
    owned_by: str = "servegate"
    """Owner."""
    max_model_len: int
    """The context the model is served with: prompt plus output tokens (runtime.max_model_len), as vLLM
    reports it in the same place."""


class ModelList(_Body):
    """Body of GET /v1/models."""

    object: Literal["list"] = "list"
    """Object type."""
    data: list[ModelCard]
    """The one served model."""


RESPONSE_MODELS: dict[str, type[BaseModel]] = {
    "completions": CompletionResponse,
    "chat": ChatCompletionResponse,
    "chat_chunk": ChatCompletionChunk,
    "embeddings": EmbeddingResponse,
    "error": ErrorBody,
    "async": AsyncStatus,
    "models": ModelList,
}
"""Every response body by name; `response_json_schema(name)` exports one."""


def response_json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one response body (see RESPONSE_MODELS for names)."""
    schema = RESPONSE_MODELS[name].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema

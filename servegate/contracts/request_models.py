"""The request models of the OpenAI-compatible API: completions, chat completions and embeddings.

Every model keeps fields outside the API aside (`extra="allow"`, at every depth) so that
`servegate.contracts.field_policy` judges them all by one rule; `servegate.contracts.requests` parses.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from servegate.contracts.constraint_fields import ConstraintFields
from servegate.contracts.request_fields import (
    KEEP_EXTRAS,
    LogitBias,
    NonEmptyText,
    Prompt,
    PromptField,
    StopField,
    Text,
    TokenId,
    whole_numbers,
)
from servegate.contracts.template_fields import TemplateFields, TruncationFields
from servegate.contracts.tool_fields import MessageToolCall, ToolFields

Endpoint = Literal["completions", "chat", "embeddings"]
"""The three request kinds: /v1/completions, /v1/chat/completions, /v1/embeddings."""


class StreamOptions(BaseModel):
    """Options of a streamed response."""

    model_config = KEEP_EXTRAS

    include_usage: bool = False
    """Send a last chunk with the request's usage (and no choices) before [DONE]."""


class _ApiRequest(BaseModel):
    """Fields shared by every endpoint. Fields outside the API are kept aside and judged by the field policy."""

    model_config = KEEP_EXTRAS

    model: str = Field(min_length=1, max_length=256)
    """The served model's name (GET /v1/models lists it)."""
    user: str | None = Field(default=None, min_length=1, max_length=256)
    """End-user id; the tenant when preprocess.tenant_from is `user`. Never logged."""
    _dropped: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _integers_as_published(cls, data: Any) -> Any:
        return whole_numbers(data)

    def dropped_fields(self) -> list[str]:
        """Paths of the fields the manifest's `unknown_fields: ignore` dropped (named in a response header)."""
        return list(self._dropped)


class _GenerationRequest(_ApiRequest, ConstraintFields, TruncationFields):
    """Sampling fields shared by completions and chat completions."""

    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Sampling temperature; 0 is greedy (deterministic, whatever the seed)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest token set whose probability reaches top_p."""
    top_k: int = Field(default=0, ge=0, le=100_000)
    """Keep only the k most likely tokens (0: no limit)."""
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    """Same seed, same request: same output. Without one, sampling draws afresh for every request (as OpenAI
    and vLLM do), unless the manifest declares `preprocess.unseeded_sampling: deterministic`, which seeds it
    with runtime.seed. Choice i of n gets seed + i."""
    stop: StopField | None = None
    """Up to 4 stop strings; generation ends before the first one and it is not returned."""
    stream: bool = False
    """Send the output as server-sent events, ending in `data: [DONE]`."""
    stream_options: StreamOptions | None = None
    """Options of the stream (only with stream: true)."""
    n: int = Field(default=1, ge=1, le=128)
    """Choices per prompt, each its own engine request (prompts x n at most the manifest's
    preprocess.max_choices_per_request)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token up to max_tokens (as vLLM; for exact-length benchmarks)."""
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    """Subtracted from the logit of every token the output already holds (as vLLM: generated tokens only)."""
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    """Subtracted from a token's logit once for every time the output already holds it (generated tokens only)."""
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    """vLLM: divides the positive logits (multiplies the negative ones) of every token in the prompt or the
    output; above 1 discourages repeating."""
    logit_bias: LogitBias | None = None
    """Token id (as a string key) -> bias added to its logit before sampling, clamped to [-100, 100] as vLLM
    does; ids must be in the vocabulary."""
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    """vLLM: drop tokens whose probability is below min_p times the likeliest token's (after temperature)."""
    min_tokens: int = Field(default=0, ge=0)
    """vLLM: tokens generated before EOS, a stop token id or a stop string may end the output (at most the
    request's max_tokens)."""
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=64)
    """vLLM: token ids that end the output (finish_reason stop; the id is not in the text)."""
    include_stop_str_in_output: bool = False
    """vLLM: keep the stop string that ended the output at the end of the text."""
    skip_special_tokens: bool = True
    """vLLM: leave special tokens out of the text (false writes them; EOS and the stop token ids never are)."""
    return_tokens_as_token_ids: bool = False
    """vLLM: name each token in logprobs (and its top alternatives) as `token_id:<id>` instead of its text, so
    tokens whose text is not valid UTF-8, or equal to another's, stay apart."""
    return_token_ids: bool = False
    """vLLM: each choice also carries `token_ids`, the ids of the tokens generated (an end-of-sequence or stop
    token included, as usage.completion_tokens counts them); in a stream, each chunk the ids of the tokens it
    delivers, so the chunks' ids add up to the whole answer's."""
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    """vLLM: also return every prompt token's log-probability and vocabulary rank, with this many likeliest
    alternatives at each position (0: the token alone); not with stream: true."""

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: Any) -> StreamOptions | None:
        if value is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities (each endpoint spells it its own way)."""
        return False

    def output_limit(self, cap: int) -> int:
        """The most tokens the request asks to generate (`cap`, the manifest's max_output_tokens, where the
        endpoint lets it default)."""
        return cap

    def prompt_count(self) -> int:
        """How many prompts the request holds (chat: one conversation)."""
        return 1


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions."""

    prompt: PromptField
    """The prompt: a string, a list of strings, a list of token ids, or a list of token-id lists. Several
    prompts are answered as several choices, prompt i's j-th choice at index i * n + j."""
    max_tokens: int = Field(default=16, ge=0)
    """Most tokens to generate (at most the manifest's postprocess.max_output_tokens); 0 only with `echo: true`
    (the prompt scored, nothing generated)."""
    logprobs: int | None = Field(default=None, ge=0, le=5)
    """Return the log-probability of each chosen token and this many top alternatives."""
    echo: bool | None = False
    """Answer the prompt before the completion, and with `logprobs` the log-probability of every prompt token
    (the first: null), as the legacy OpenAI API and vLLM do; lm-eval's log-likelihood tasks send it."""

    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities."""
        return self.logprobs is not None

    def output_limit(self, cap: int) -> int:
        """The most tokens the request asks to generate: max_tokens (its default 16 when absent)."""
        return self.max_tokens

    def prompts(self) -> list[Prompt]:
        """The prompts, in the order their choices are answered."""
        return list(self.prompt)

    def prompt_count(self) -> int:
        """How many prompts the request holds."""
        return len(self.prompt)


class TextPart(BaseModel):
    """One text part of a message's content."""

    model_config = KEEP_EXTRAS

    type: Literal["text"]
    """Only text parts are supported."""
    text: Text
    """The text."""


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(
        **KEEP_EXTRAS,
        json_schema_extra={  # content may be left out only by an assistant message with calls
            "anyOf": [
                {"required": ["content"]},
                {"properties": {"role": {"const": "assistant"}}, "required": ["tool_calls"]},
            ]
        },
    )

    role: Literal["system", "developer", "user", "assistant", "tool"]
    """Who wrote the message (`tool`: the result of an earlier call; needs postprocess.tools)."""
    tool_calls: list[MessageToolCall] | None = Field(default=None, max_length=1024)
    """The calls an assistant message made (needs postprocess.tools)."""
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)
    """The call a `tool` message answers."""
    content: Text | list[TextPart] | None = Field(default=None, validate_default=True)
    """The message text, or a list of text parts; only an assistant message with tool_calls may leave it out."""
    name: str | None = Field(default=None, max_length=64)
    """Optional name of the author."""

    @field_validator("content")
    @classmethod
    def _content_where_needed(cls, value: Any, info: Any) -> Any:
        if value is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise ValueError("content is required (only an assistant message with tool_calls may leave it out)")
        return value

    @model_validator(mode="after")
    def _calls_where_they_belong(self) -> ChatMessage:
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def text(self) -> str:
        """The content as one string ("" when an assistant message has only tool calls)."""
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(_GenerationRequest, ToolFields, TemplateFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    """The conversation so far, rendered with the manifest's chat template."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens to generate (default and maximum: the manifest's postprocess.max_output_tokens)."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Newer name of max_tokens; give one of the two."""
    logprobs: bool = False
    """Return the log-probability of each chosen token."""
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    """Also return this many top alternatives per token (needs logprobs: true)."""

    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities."""
        return self.logprobs

    def output_limit(self, cap: int) -> int:
        """The most tokens the request asks to generate: max_completion_tokens or max_tokens, else `cap`."""
        return self.max_completion_tokens or self.max_tokens or cap


class EmbeddingRequest(_ApiRequest):
    """POST /v1/embeddings."""

    input: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1, max_length=2048)]
    """One text or a list of texts to embed."""
    encoding_format: Literal["float", "base64"] = "float"
    """`float`: lists of numbers; `base64`: little-endian float32 bytes, base64-encoded."""
    dimensions: int | None = Field(default=None, ge=1)
    """Not supported: the model's own dimension is always returned."""

    def texts(self) -> list[str]:
        """The inputs as a list."""
        return [self.input] if isinstance(self.input, str) else list(self.input)


ApiRequest = CompletionRequest | ChatCompletionRequest | EmbeddingRequest
REQUEST_MODELS: dict[Endpoint, type[ApiRequest]] = {
    "completions": CompletionRequest,
    "chat": ChatCompletionRequest,
    "embeddings": EmbeddingRequest,
}

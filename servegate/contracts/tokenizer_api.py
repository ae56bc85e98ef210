"""The tokenizer routes' contract, shaped as vLLM shapes them: POST /tokenize, POST /detokenize, GET /tokenizer_info.

Clients such as lm-eval's remote tokenizer (its default `tokenizer_backend=auto`) call these instead of
downloading the tokenizer: /tokenizer_info must carry `eos_token`, /tokenize must answer `tokens`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servegate.contracts.request_fields import KEEP_EXTRAS, Text, TokenId, whole_numbers
from servegate.contracts.request_models import ChatMessage


class TokenizePromptRequest(BaseModel):
    """POST /tokenize with a completion prompt."""

    model_config = KEEP_EXTRAS

    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The served model's name (optional, as in vLLM)."""
    prompt: Text = Field(max_length=1_048_576)
    """The text to tokenize."""
    add_special_tokens: bool = True
    """Add the tokenizer's special tokens (e.g. BOS), as a completion request does."""
    return_token_strs: bool = False
    """Also return each token's text."""


class TokenizeChatRequest(BaseModel):
    """POST /tokenize with chat messages, rendered with the manifest's chat template first."""

    model_config = KEEP_EXTRAS

    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The served model's name (optional, as in vLLM)."""
    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)
    """The conversation, rendered as /v1/chat/completions renders it (with the generation prompt)."""
    add_special_tokens: bool = False
    """Add special tokens on top of what the chat template writes (rarely wanted)."""
    return_token_strs: bool = False
    """Also return each token's text."""


class TokenizeResponse(BaseModel):
    """Body of POST /tokenize."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    count: int = Field(ge=0)
    """Number of tokens."""
    max_model_len: int = Field(ge=1)
    """The manifest's runtime.max_model_len (prompt plus output tokens)."""
    tokens: list[int]
    """The token ids."""
    token_strs: list[str] | None = None
    """Each token's text, when return_token_strs was asked for."""


class DetokenizeRequest(BaseModel):
    """POST /detokenize."""

    model_config = KEEP_EXTRAS

    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The served model's name (optional, as in vLLM)."""
    tokens: list[TokenId] = Field(max_length=1_048_576)
    """The token ids to turn back into text."""

    @model_validator(mode="before")
    @classmethod
    def _integers_as_published(cls, data: Any) -> Any:
        return whole_numbers(data)


class DetokenizeResponse(BaseModel):
    """Body of POST /detokenize."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    prompt: str
    """The text of the tokens (special tokens written out)."""


class TokenizerInfo(BaseModel):
    """Body of GET /tokenizer_info: the tokenizer's configuration (tokenizer_config.json's fields, no file paths)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    tokenizer_class: str
    """The tokenizer's class name."""
    bos_token: str | None = None
    """Beginning-of-sequence token text."""
    eos_token: str | None = None
    """End-of-sequence token text."""
    pad_token: str | None = None
    """Padding token text."""
    unk_token: str | None = None
    """Unknown-token text."""
    chat_template: str | None = None
    """The Jinja chat template /v1/chat/completions renders with (null with chat_template: none)."""
    model_max_length: int = Field(ge=1)
    """The manifest's runtime.max_model_len."""
    vocab_size: int = Field(ge=0)
    """Number of token ids (ids are 0 to vocab_size - 1)."""


def tokenizer_info(tokenizer: Any, max_model_len: int, chat_template: str | None) -> dict[str, Any]:
    """The /tokenizer_info body of a Hugging Face tokenizer; file paths and non-JSON values are left out."""
    fields: dict[str, Any] = {}
    for key, value in getattr(tokenizer, "init_kwargs", {}).items():
        if key.endswith(("_file", "name_or_path", "_dir")) or key in ("added_tokens_decoder", "auto_map"):
            continue  # paths of this machine, and structures clients do not read
        if isinstance(value, str | int | float | bool) or value is None:
            fields[key] = value
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        token = getattr(tokenizer, name, None)
        fields[name] = token if isinstance(token, str) else None
    fields.update(
        tokenizer_class=type(tokenizer).__name__,
        chat_template=chat_template,
        model_max_length=max_model_len,
        vocab_size=len(tokenizer),
    )
    return TokenizerInfo.model_validate(fields).model_dump(mode="json")

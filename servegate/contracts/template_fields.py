"""The prompt-shaping fields of a request (vLLM's): how the chat template renders the conversation, and how many
prompt tokens are kept.

- `add_generation_prompt` (default true), `continue_final_message`, `chat_template_kwargs` and `chat_template`:
  chat only, each accepted only where the manifest's `preprocess.template_fields` names it (a deployment
  decides whether clients may reshape its prompts); sent with their defaults they ask for nothing.
- `truncate_prompt_tokens` (-1: the manifest's max_input_tokens) and `truncation_side`: keep at most that many
  prompt tokens, from the side asked (else `left`, the last tokens), as vLLM 0.32 does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from servegate.contracts.errors import ServingError
from servegate.contracts.sections import Preprocess, TemplateField

RESERVED_KWARGS = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "continue_final_message", "chat_template", "tokenize"}
)
"""Template variables servegate itself sets: chat_template_kwargs may not set them."""


class TruncationFields(BaseModel):
    """vLLM's prompt truncation fields (both generation endpoints)."""

    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    """vLLM: keep at most this many prompt tokens (-1: preprocess.max_input_tokens; at most that); the tokens
    dropped are counted in usage.truncated_tokens."""
    truncation_side: Literal["left", "right"] | None = None
    """vLLM: with truncate_prompt_tokens, `left` keeps the last tokens and `right` the first (absent: left, as
    vLLM, which loads a generative model's tokenizer with truncation_side left)."""

    def truncation_limit(self, max_input_tokens: int) -> int | None:
        """The prompt tokens the request keeps at most (None: no truncation asked)."""
        if self.truncate_prompt_tokens is None:
            return None
        return max_input_tokens if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens


class TemplateFields(BaseModel):
    """vLLM's chat-template request fields (mixed into the chat request model)."""

    add_generation_prompt: bool = True
    """vLLM: end the prompt with the template's assistant header (false: the conversation as it stands)."""
    continue_final_message: bool = False
    """vLLM: leave the final message open, so the answer continues it (needs add_generation_prompt: false)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM: more variables for the chat template (e.g. enable_thinking)."""
    chat_template: str | None = Field(default=None, min_length=1, max_length=65_536)
    """vLLM: a Jinja chat template used instead of the manifest's."""

    def template_changes(self) -> list[TemplateField]:
        """The template fields set to something other than their defaults, in field order."""
        changed: list[TemplateField] = []
        if not self.add_generation_prompt:
            changed.append("add_generation_prompt")
        if self.continue_final_message:
            changed.append("continue_final_message")
        if self.chat_template_kwargs:
            changed.append("chat_template_kwargs")
        if self.chat_template is not None:
            changed.append("chat_template")
        return changed


def check_prompt_fields(pre: Preprocess, truncation: TruncationFields, template: TemplateFields | None) -> None:
    """The manifest's limits on the prompt-shaping fields (ServingError, 400)."""
    asked = truncation.truncate_prompt_tokens
    if asked == 0:
        detail = "truncate_prompt_tokens: 0 would leave no prompt: give -1 or a count of at least 1"
        raise ServingError("invalid_request", param="truncate_prompt_tokens", detail=detail)
    if asked is not None and asked > pre.max_input_tokens:
        detail = (
            f"truncate_prompt_tokens: must be <= {pre.max_input_tokens}, this model's max_input_tokens (got {asked})"
        )
        raise ServingError("invalid_request", param="truncate_prompt_tokens", detail=detail)
    if truncation.truncation_side is not None and asked is None:
        detail = "truncation_side applies only with truncate_prompt_tokens"
        raise ServingError("invalid_request", param="truncation_side", detail=detail)
    if template is None:
        return
    for name in template.template_changes():
        if name not in pre.template_fields:
            detail = f"this deployment does not take {name} from requests (preprocess.template_fields)"
            raise ServingError("unsupported_parameter", param=name, detail=detail)
    if template.continue_final_message and template.add_generation_prompt:
        detail = "continue_final_message continues the last message, so it needs add_generation_prompt: false"
        raise ServingError("invalid_request", param="continue_final_message", detail=detail)
    reserved = sorted(RESERVED_KWARGS & set(template.chat_template_kwargs or {}))
    if reserved:
        detail = f"chat_template_kwargs may not set {', '.join(reserved)}: servegate sets it"
        raise ServingError("invalid_request", param=f"chat_template_kwargs.{reserved[0]}", detail=detail)

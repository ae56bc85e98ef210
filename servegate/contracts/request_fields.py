"""Field types of the request contract: text without control characters, the completion prompt in every form
the OpenAI API defines, stop strings, and integers as JSON Schema writes them."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, WithJsonSchema

KEEP_EXTRAS = ConfigDict(extra="allow", strict=True, use_attribute_docstrings=True)
"""Request models keep fields outside the API aside, at every depth, for the field policy to judge."""

# C0 control characters other than tab, newline and carriage return: refused in text fields (400), so
# no engine or tokenizer ever sees them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
CONTROL_FREE_PATTERN = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]*$"


def _control_free(value: str) -> str:
    found = _CONTROL.search(value)
    if found:
        raise ValueError(f"control character U+{ord(found.group()):04X} is not accepted in text")
    return value


_NO_CONTROLS = Field(json_schema_extra={"pattern": CONTROL_FREE_PATTERN})
Text = Annotated[str, AfterValidator(_control_free), _NO_CONTROLS]
"""A string without C0 control characters (tab, newline and carriage return are fine)."""
NonEmptyText = Annotated[str, Field(min_length=1), AfterValidator(_control_free), _NO_CONTROLS]
"""A Text of at least one character."""
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
"""One token id."""
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
"""A non-empty list of token ids: one pre-tokenized prompt."""
_ID_KEY = {"pattern": "^[0-9]+$", "maxLength": 10}
"""A token id as an object key: decimal digits, at most 10 (ids are below 2**31)."""
TokenIdKey = Annotated[str, Field(pattern=_ID_KEY["pattern"], max_length=_ID_KEY["maxLength"])]
"""A token id as a JSON object key (logit_bias: {"50256": -100})."""
LOGIT_BIAS_ENTRIES = 1024
"""Most token ids one logit_bias may name."""
LOGIT_BIAS_LIMIT = 100.0
"""A bias is clamped to [-100, 100], as vLLM does (OpenAI documents the same range)."""
Bias = Annotated[float, Field(allow_inf_nan=False)]
"""One logit bias: a finite number, clamped to [-LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT] when applied."""
LogitBias = Annotated[
    dict[TokenIdKey, Bias],
    Field(max_length=LOGIT_BIAS_ENTRIES),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": LOGIT_BIAS_ENTRIES,
            "propertyNames": dict(_ID_KEY),
            "additionalProperties": {"type": "number"},
        }
    ),
]
"""logit_bias: at most 1,024 token ids (as string keys), each with its bias."""


def whole_number(value: Any) -> Any:
    """A float with no fractional part is that integer: JSON Schema's `integer`, which the published request
    schema uses, admits 12.0, so a client that validated against it must not be refused for it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


INTEGER_FIELDS = (
    "top_k",
    "seed",
    "n",
    "max_tokens",
    "logprobs",
    "max_completion_tokens",
    "top_logprobs",
    "dimensions",
    "min_tokens",
)
"""Request fields typed as integers (strict otherwise: "12" and true stay errors)."""


def whole_numbers(data: Any) -> Any:
    """The request body with whole-number floats in integer fields (and token-id prompts) made integers."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key in INTEGER_FIELDS:
        if key in out:
            out[key] = whole_number(out[key])
    if isinstance(out.get("stop_token_ids"), list):
        out["stop_token_ids"] = [whole_number(v) for v in out["stop_token_ids"]]
    for key in ("prompt", "tokens"):
        if isinstance(out.get(key), list):
            out[key] = [[whole_number(v) for v in p] if isinstance(p, list) else whole_number(p) for p in out[key]]
    return out


Prompt = str | list[int]
"""One completion prompt: text, or token ids."""


def _prompt_list(value: Any) -> Any:
    """Every prompt form as a list of prompts: "text", ["a", "b"], [1, 2, 3] and [[1, 2], [3]]."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [value]
    if isinstance(value, list) and not value:
        raise ValueError("must not be empty")
    if isinstance(value, list):
        return value
    raise ValueError("must be a string, a list of strings, a list of token ids or a list of token-id lists")


_TEXT_SCHEMA = {"type": "string", "minLength": 1, "pattern": CONTROL_FREE_PATTERN}
_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}, "minItems": 1}
PromptField = Annotated[
    list[NonEmptyText | TokenIds],
    BeforeValidator(_prompt_list),
    Field(min_length=1),
    WithJsonSchema(
        {
            "anyOf": [
                _TEXT_SCHEMA,
                {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1},
                _IDS_SCHEMA,
                {"type": "array", "items": _IDS_SCHEMA, "minItems": 1},
            ]
        }
    ),
]
"""The completions prompt: a string, a list of strings, a list of token ids, or a list of token-id lists;
parsed as a list of prompts, each answered by its own choice."""


def _stop_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


StopField = Annotated[
    list[NonEmptyText],
    BeforeValidator(_stop_list),
    Field(max_length=4),
    WithJsonSchema({"anyOf": [_TEXT_SCHEMA, {"type": "array", "items": _TEXT_SCHEMA, "maxItems": 4}]}),
]
"""Up to 4 stop strings, or one."""

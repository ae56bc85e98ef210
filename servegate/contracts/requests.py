"""The request contract of the OpenAI-compatible API: models, parsing, and the JSON Schema with the limits baked in.

A request body goes through three checks, each ending in a catalogued ServingError that names `param`:
`decode_body` (UTF-8, JSON, valid Unicode), `parse_request` (types, ranges, unknown fields, the manifest's
limits, the manifest's extra `input_schema`). `request_json_schema` states the same rules as JSON Schema
for clients and the contract gate. Responses are in `servegate.contracts.responses`.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel

Endpoint = Literal["completions", "chat", "embeddings"]
"""The three request kinds: /v1/completions, /v1/chat/completions, /v1/embeddings."""

# C0 control characters other than tab, newline and carriage return: refused in text fields (400), so
# no engine or tokenizer ever sees them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROL_FREE_PATTERN = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]*$"


def _control_free(value: str) -> str:
    found = _CONTROL.search(value)
    if found:
        raise ValueError(f"control character U+{ord(found.group()):04X} is not accepted in text")
    return value


_NO_CONTROLS = Field(json_schema_extra={"pattern": _CONTROL_FREE_PATTERN})
Text = Annotated[str, AfterValidator(_control_free), _NO_CONTROLS]
"""A string without C0 control characters (tab, newline and carriage return are fine)."""
NonEmptyText = Annotated[str, Field(min_length=1), AfterValidator(_control_free), _NO_CONTROLS]
"""A Text of at least one character."""


def _one_prompt(value: Any) -> Any:
    """A completion prompt: a string, a list with one string, or a list of token ids."""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if len(value) > 1:
            raise ValueError(f"one prompt per request is supported (got a list of {len(value)})")
        return value[0]
    if isinstance(value, list) and not value:
        raise ValueError("must not be empty")
    if isinstance(value, str | list):
        return value
    raise ValueError("must be a string, a list with one string, or a list of token ids")


def _whole_number(value: Any) -> Any:
    """A float with no fractional part is that integer: JSON Schema's `integer`, which the published request
    schema uses, admits 12.0, so a client that validated against it must not be refused for it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_INTEGER_FIELDS = (
    "top_k",
    "seed",
    "n",
    "max_tokens",
    "logprobs",
    "max_completion_tokens",
    "top_logprobs",
    "dimensions",
)
"""Request fields typed as integers (strict otherwise: "12" and true stay errors)."""


def _whole_numbers(data: Any) -> Any:
    """The request body with whole-number floats in integer fields (and token-id prompts) made integers."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key in _INTEGER_FIELDS:
        if key in out:
            out[key] = _whole_number(out[key])
    if isinstance(out.get("prompt"), list):
        out["prompt"] = [_whole_number(v) for v in out["prompt"]]
    return out


def _stop_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


_TEXT_SCHEMA = {"type": "string", "minLength": 1, "pattern": _CONTROL_FREE_PATTERN}
PromptField = Annotated[
    NonEmptyText | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)],
    BeforeValidator(_one_prompt),
    WithJsonSchema(
        {
            "anyOf": [
                _TEXT_SCHEMA,
                {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1, "maxItems": 1},
                {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
            ]
        }
    ),
]
StopField = Annotated[
    list[NonEmptyText],
    BeforeValidator(_stop_list),
    Field(max_length=4),
    WithJsonSchema({"anyOf": [_TEXT_SCHEMA, {"type": "array", "items": _TEXT_SCHEMA, "maxItems": 4}]}),
]


class StreamOptions(BaseModel):
    """Options of a streamed response."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)

    include_usage: bool = False
    """Send a last chunk with the request's usage (and no choices) before [DONE]."""


class _ApiRequest(BaseModel):
    """Fields shared by every endpoint. Unknown top-level fields are kept aside and judged per manifest."""

    model_config = ConfigDict(extra="allow", strict=True, use_attribute_docstrings=True)

    model: str = Field(min_length=1, max_length=256)
    """The served model's name (GET /v1/models lists it)."""
    user: str | None = Field(default=None, min_length=1, max_length=256)
    """End-user id; the tenant when preprocess.tenant_from is `user`. Never logged."""

    @model_validator(mode="before")
    @classmethod
    def _integers_as_published(cls, data: Any) -> Any:
        return _whole_numbers(data)


class _GenerationRequest(_ApiRequest):
    """Sampling fields shared by completions and chat completions."""

    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Sampling temperature; 0 is greedy."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest token set whose probability reaches top_p."""
    top_k: int = Field(default=0, ge=0, le=100_000)
    """Keep only the k most likely tokens (0: no limit)."""
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    """Same seed, same request: same output (None: the manifest's runtime.seed)."""
    stop: StopField | None = None
    """Up to 4 stop strings; generation ends before the first one and it is not returned."""
    stream: bool = False
    """Send the output as server-sent events, ending in `data: [DONE]`."""
    stream_options: StreamOptions | None = None
    """Options of the stream (only with stream: true)."""
    n: int = Field(default=1, ge=1, le=128, json_schema_extra={"const": 1})
    """Number of choices; only 1 is supported."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token up to max_tokens (as vLLM; for exact-length benchmarks)."""

    @field_validator("n")
    @classmethod
    def _single_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported; send separate requests for more choices")
        return value

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: Any) -> StreamOptions | None:
        if value is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities (each endpoint spells it its own way)."""
        return False


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions."""

    prompt: PromptField
    """The prompt: a string, a list with one string, or a list of token ids."""
    max_tokens: int = Field(default=16, ge=1)
    """Most tokens to generate (at most the manifest's postprocess.max_output_tokens)."""
    logprobs: int | None = Field(default=None, ge=0, le=5)
    """Return the log-probability of each chosen token and this many top alternatives."""

    def wants_logprobs(self) -> bool:
        """Whether the client asked for log-probabilities."""
        return self.logprobs is not None


class TextPart(BaseModel):
    """One text part of a message's content."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    """Only text parts are supported."""
    text: Text
    """The text."""


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)

    role: Literal["system", "developer", "user", "assistant"]
    """Who wrote the message."""
    content: Text | list[TextPart]
    """The message text, or a list of text parts."""
    name: str | None = Field(default=None, max_length=64)
    """Optional name of the author."""

    def text(self) -> str:
        """The content as one string."""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(_GenerationRequest):
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


REQUEST_MODELS: dict[str, type[_ApiRequest]] = {
    "completions": CompletionRequest,
    "chat": ChatCompletionRequest,
    "embeddings": EmbeddingRequest,
}
ApiRequest = CompletionRequest | ChatCompletionRequest | EmbeddingRequest


# --- decoding and parsing ----------------------------------------------------------------------------


def _lone_surrogate_path(value: Any, path: str) -> str | None:
    """The path of the first string holding an unpaired UTF-16 surrogate (JSON can escape one: "\\ud800")."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        sub = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
        found = _lone_surrogate_path(item, sub)
        if found:
            return found
    return None


def decode_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body: UTF-8, then strict JSON, then a JSON object of valid Unicode strings."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ServingError("invalid_request", detail=f"the body is not valid UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        detail = f"the body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        raise ServingError("invalid_request", detail=detail) from None
    except RecursionError:
        raise ServingError("invalid_request", detail="the body's JSON is nested too deeply") from None
    if not isinstance(data, dict):
        raise ServingError("invalid_request", detail=f"the body must be a JSON object (got {type(data).__name__})")
    bad = _lone_surrogate_path(data, "")
    if bad:
        raise ServingError(
            "invalid_request", param=bad, detail=f"{bad}: contains an unpaired surrogate; text must be valid Unicode"
        )
    return data


def _is_union_tag(part: str) -> bool:
    """pydantic names union branches in error locations ('str', 'list[int]', 'TextPart'); they are not data."""
    return "[" in part or part[:1].isupper() or part in {"str", "int", "float", "bool", "none"}


def _data_path(data: Any, loc: tuple[Any, ...]) -> str:
    """The JSON path (`messages[0].content`) of an error location, following the data itself."""
    path, node = "", data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(part, str) and not _is_union_tag(part):
            node = None  # a missing field: name it and stop
        else:
            continue
        path = f"{path}[{part}]" if isinstance(part, int) else (f"{path}.{part}" if path else part)
        if node is None:
            break
    return path or "body"


def _message(error: dict[str, Any], param: str) -> str:
    msg = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "missing":
        return f"'{param}' is required"
    shown = error.get("input")
    if isinstance(shown, bool | int | float) or shown is None:
        return f"{param}: {msg} (got {json.dumps(shown)})"
    return f"{param}: {msg}"


def _from_validation(exc: ValidationError, data: dict[str, Any]) -> ServingError:
    errors = exc.errors(include_url=False)
    # Report an unknown field first; else the first field's deepest error (for a union, the branch that
    # matched the value's shape goes deepest: a list content's bad part beats "should be a string").
    first = errors[0]["loc"][:1]
    deepest = max((e for e in errors if e["loc"][:1] == first), key=lambda e: len(e["loc"]))
    error = next((e for e in errors if e["type"] == "extra_forbidden"), deepest)
    param = _data_path(data, tuple(error["loc"]))
    if error["type"] == "extra_forbidden":
        return ServingError("unknown_parameter", param=param)
    return ServingError("invalid_request", param=param, detail=_message(error, param))


def _check_limits(served: ServedModel, endpoint: Endpoint, request: ApiRequest) -> None:
    """The manifest's own limits, beyond what the request model states."""
    if request.model != served.name:
        raise ServingError(
            "not_found", param="model", detail=f"model '{request.model}' is not served here; available: {served.name}"
        )
    if endpoint == "embeddings":
        assert isinstance(request, EmbeddingRequest)
        if request.dimensions is not None:
            raise ServingError(
                "invalid_request", param="dimensions", detail="dimensions is not supported by this model"
            )
        return
    assert isinstance(request, CompletionRequest | ChatCompletionRequest)
    cap = served.postprocess.max_output_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        asked = getattr(request, name, None) if name in type(request).model_fields else None  # not ignored extras
        if asked is not None and asked > cap:
            raise ServingError(
                "invalid_request",
                param=name,
                detail=f"{name}: must be <= {cap}, this model's max_output_tokens (got {asked})",
            )
    if request.wants_logprobs() and not served.postprocess.logprobs:
        raise ServingError(
            "invalid_request", param="logprobs", detail="logprobs: log-probabilities are not offered by this deployment"
        )
    if isinstance(request, ChatCompletionRequest) and request.top_logprobs and not request.logprobs:
        raise ServingError("invalid_request", param="top_logprobs", detail="top_logprobs: needs logprobs: true")
    if isinstance(request, ChatCompletionRequest) and None not in (request.max_tokens, request.max_completion_tokens):
        raise ServingError(
            "invalid_request", param="max_tokens", detail="give max_tokens or max_completion_tokens, not both"
        )


def _check_input_schema(schema: dict[str, Any], data: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is None:
        return
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        path = f"{path}.{missing[0]}".lstrip(".") if missing else path
        raise ServingError("invalid_request", param=path or None, detail=f"'{path}' is required by this deployment")
    raise ServingError("invalid_request", param=path or None, detail=f"{path or 'body'}: {error.message}")


def parse_request(served: ServedModel, endpoint: Endpoint, data: dict[str, Any]) -> ApiRequest:
    """Validate a decoded body against the contract and the manifest; a ServingError names what to change."""
    model_cls = REQUEST_MODELS[endpoint]
    try:
        request = model_cls.model_validate(data)
    except ValidationError as exc:
        raise _from_validation(exc, data) from None
    extra_ok = set((served.preprocess.input_schema or {}).get("properties", {}))
    unknown = sorted(set(request.model_extra or {}) - extra_ok)
    if unknown and served.preprocess.unknown_fields == "reject":
        raise ServingError("unknown_parameter", param=unknown[0])
    _check_limits(served, endpoint, request)  # type: ignore[arg-type]
    if served.preprocess.input_schema:
        _check_input_schema(served.preprocess.input_schema, data)
    return request  # type: ignore[return-value]


def request_json_schema(served: ServedModel, endpoint: Endpoint) -> dict[str, Any]:
    """The JSON Schema of one endpoint's requests, with this manifest's limits and input_schema baked in."""
    schema = REQUEST_MODELS[endpoint].model_json_schema()
    props = schema["properties"]
    props["model"] = {**props["model"], "const": served.name}
    if endpoint != "embeddings":
        cap = served.postprocess.max_output_tokens
        for name in ("max_tokens", "max_completion_tokens"):
            if name not in props:
                continue
            field = props[name]
            branches = field.get("anyOf", [field])
            for branch in branches:
                if branch.get("type") == "integer":
                    branch["maximum"] = cap
        if not served.postprocess.logprobs:
            props["logprobs"] = {"enum": [None, False], "description": "Not offered by this deployment."}
    else:
        props["dimensions"] = {"type": "null", "description": props["dimensions"].get("description", "")}
    extra = served.preprocess.input_schema
    for name in (extra or {}).get("properties", {}):
        props.setdefault(name, {})
    schema["additionalProperties"] = served.preprocess.unknown_fields == "ignore"
    if extra:
        schema["allOf"] = [{k: v for k, v in extra.items() if k != "$schema"}]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"{served.name} {endpoint} request"
    return schema

"""The request contract of the OpenAI-compatible API: parsing, and the JSON Schema with the limits baked in.

A request body goes through three checks, each ending in a catalogued ServingError that names `param`:
`decode_body` (UTF-8, JSON, valid Unicode), `parse_request` (types, ranges, fields outside the API at every
depth as `servegate.contracts.field_policy` rules, the manifest's limits, the manifest's extra
`input_schema`). `request_json_schema` states the same rules as JSON Schema for clients, the published
OpenAPI document and the contract gate. The models are in `servegate.contracts.request_models`, responses
in `servegate.contracts.responses`.
"""

from __future__ import annotations

import json
from typing import Any, Literal, overload

import jsonschema
from pydantic import ValidationError

from servegate.contracts.constraint_fields import check_constraint, check_unended
from servegate.contracts.errors import ServingError
from servegate.contracts.field_checks import (
    check_logprobs_offered,
    check_min_tokens,
    check_token_ids,
    validation_error,
)
from servegate.contracts.field_policy import HARMLESS, extra_fields, judge_extras, neutral_schema
from servegate.contracts.manifest import ServedModel
from servegate.contracts.request_models import (
    REQUEST_MODELS,
    ApiRequest,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    EmbeddingRequest,
    Endpoint,
    StreamOptions,
    TextPart,
)
from servegate.contracts.template_fields import check_prompt_fields
from servegate.contracts.tool_fields import check_tools

__all__ = [
    "REQUEST_MODELS",
    "ApiRequest",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "EmbeddingRequest",
    "Endpoint",
    "StreamOptions",
    "TextPart",
    "decode_body",
    "parse_request",
    "request_json_schema",
    "validation_error",
]


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
    check_min_tokens(request.min_tokens, request.output_limit(cap))
    constraint = request.output_constraint()
    if constraint is not None:
        check_constraint(
            served.postprocess.structured_output,
            constraint,
            ignore_eos=request.ignore_eos,
            min_tokens=request.min_tokens,
        )
    if isinstance(request, ChatCompletionRequest):
        _check_tool_fields(served, request, constraint is not None)
    check_prompt_fields(served.preprocess, request, request if isinstance(request, ChatCompletionRequest) else None)
    if request.wants_logprobs():
        check_logprobs_offered(served)
    if request.prompt_logprobs is not None:
        check_logprobs_offered(served, "prompt_logprobs")
    if request.prompt_logprobs is not None and request.stream:
        detail = "prompt_logprobs cannot be combined with stream: true (as vLLM)"
        raise ServingError("invalid_request", param="prompt_logprobs", detail=detail)
    if isinstance(request, CompletionRequest) and request.max_tokens == 0 and not request.echo:
        raise ServingError(
            "invalid_request", param="max_tokens", detail="max_tokens: 0 generates nothing: it needs echo: true"
        )
    if isinstance(request, ChatCompletionRequest) and request.top_logprobs and not request.logprobs:
        raise ServingError("invalid_request", param="top_logprobs", detail="top_logprobs: needs logprobs: true")
    if isinstance(request, ChatCompletionRequest) and None not in (request.max_tokens, request.max_completion_tokens):
        raise ServingError(
            "invalid_request", param="max_tokens", detail="give max_tokens or max_completion_tokens, not both"
        )


def _check_tool_fields(served: ServedModel, request: ChatCompletionRequest, constrained: bool) -> None:
    """The tool fields within the manifest's limits; a forced choice is a constraint, so it takes no other."""
    check_tools(served.postprocess.tools, request, request.messages)
    mode = request.tool_mode()
    if mode not in ("required", "named"):
        return
    if constrained:
        detail = f"tool_choice {mode} decodes the call under its own constraint: leave the output constraint out"
        raise ServingError("invalid_request", param="tool_choice", detail=detail)
    check_unended(ignore_eos=request.ignore_eos, min_tokens=request.min_tokens)


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


def _check_choices(served: ServedModel, request: CompletionRequest | ChatCompletionRequest) -> None:
    """Prompts x n within preprocess.max_choices_per_request (each choice is its own engine request)."""
    limit = served.preprocess.max_choices_per_request
    prompts = request.prompt_count()
    if prompts * request.n <= limit:
        return
    if request.n == 1:
        param, asked = "prompt", f"{prompts} prompts"
    else:
        param, asked = "n", f"n={request.n}" + (f" for each of {prompts} prompts" if prompts > 1 else "")
    detail = (
        f"{param}: at most {limit} choices per request (preprocess.max_choices_per_request); got {asked}: "
        "send fewer per request"
    )
    raise ServingError("invalid_request", param=param, detail=detail)


def _request_token_ids(request: CompletionRequest | ChatCompletionRequest) -> dict[str, list[int]]:
    """Every token id the body names, by the field it came in (each prompt of several as `prompt[i]`)."""
    named: dict[str, list[int]] = {}
    if isinstance(request, CompletionRequest):
        prompts = request.prompts()
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, list):
                named["prompt" if len(prompts) == 1 else f"prompt[{i}]"] = prompt
    named["logit_bias"] = [int(token) for token in request.logit_bias or {}]
    named["stop_token_ids"] = list(request.stop_token_ids or ())
    return named


@overload
def parse_request(
    served: ServedModel,
    endpoint: Literal["completions", "chat"],
    data: dict[str, Any],
    vocab_size: int | None = None,
) -> CompletionRequest | ChatCompletionRequest: ...


@overload
def parse_request(
    served: ServedModel, endpoint: Endpoint, data: dict[str, Any], vocab_size: int | None = None
) -> ApiRequest: ...


def parse_request(
    served: ServedModel, endpoint: Endpoint, data: dict[str, Any], vocab_size: int | None = None
) -> ApiRequest:
    """Validate a decoded body against the contract and the manifest; a ServingError names what to change.

    `vocab_size`: the loaded tokenizer's, so the token ids the body names are checked here, before anything
    is queued (None where no tokenizer is loaded: the model runner refuses an id past its embeddings).
    The engine checks none of these fields again (`GenerationRequest.from_api`).
    """
    model_cls = REQUEST_MODELS[endpoint]
    try:
        request = model_cls.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data) from None
    allowed = set((served.preprocess.input_schema or {}).get("properties", {}))
    dropped = judge_extras(list(extra_fields(request)), endpoint, served.preprocess.unknown_fields, allowed)
    request._dropped = dropped
    _check_limits(served, endpoint, request)
    if isinstance(request, CompletionRequest | ChatCompletionRequest):
        _check_choices(served, request)
        if vocab_size is not None:
            check_token_ids(vocab_size, _request_token_ids(request))
    if served.preprocess.input_schema:
        _check_input_schema(served.preprocess.input_schema, data)
    return request


def _close_objects(schema: dict[str, Any], open_objects: bool) -> None:
    """additionalProperties of the request object and every nested model, as the manifest's policy says."""
    schema["additionalProperties"] = open_objects
    for definition in schema.get("$defs", {}).values():
        if definition.get("type") == "object" and "properties" in definition:
            definition["additionalProperties"] = open_objects


def _generation_limits(served: ServedModel, endpoint: Endpoint, props: dict[str, Any]) -> None:
    cap = served.postprocess.max_output_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        if name not in props:
            continue
        field = props[name]
        for branch in field.get("anyOf", [field]):
            if branch.get("type") == "integer":
                branch["maximum"] = cap
    if not served.postprocess.logprobs:
        props["logprobs"] = {"enum": [None, False], "description": "Not offered by this deployment."}
    choices = served.preprocess.max_choices_per_request
    props["n"] = {**props["n"], "maximum": choices}
    if endpoint == "completions":
        for branch in props["prompt"]["anyOf"]:
            if branch["type"] == "array" and branch["items"].get("type") in ("string", "array"):
                branch["maxItems"] = choices
    for name, neutral in neutral_schema(endpoint).items():
        props.setdefault(name, neutral)


def _cross_field_rules(endpoint: Endpoint) -> list[dict[str, Any]]:
    """The checks parse_request makes across fields, as JSON Schema (so a schema-valid body is not refused)."""
    rules: list[dict[str, Any]] = [
        {  # stream_options only with stream: true
            "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
            "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
        }
    ]
    if endpoint == "completions":
        rules.append(  # max_tokens: 0 needs echo: true
            {
                "if": {"required": ["max_tokens"], "properties": {"max_tokens": {"const": 0}}},
                "then": {"required": ["echo"], "properties": {"echo": {"const": True}}},
            }
        )
    if endpoint == "chat":
        rules.append(  # top_logprobs > 0 needs logprobs: true
            {
                "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
                "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
            }
        )
        both = {"type": "integer"}
        rules.append(  # max_tokens or max_completion_tokens, not both
            {
                "not": {
                    "required": ["max_tokens", "max_completion_tokens"],
                    "properties": {"max_tokens": both, "max_completion_tokens": both},
                }
            }
        )
    return rules


def request_json_schema(served: ServedModel, endpoint: Endpoint) -> dict[str, Any]:
    """The JSON Schema of one endpoint's requests, with this manifest's limits and input_schema baked in."""
    schema = REQUEST_MODELS[endpoint].model_json_schema()
    props = schema["properties"]
    props["model"] = {**props["model"], "const": served.name}
    if endpoint != "embeddings":
        _generation_limits(served, endpoint, props)
        if endpoint == "chat":
            message = schema["$defs"]["ChatMessage"]["properties"]
            message["tool_calls"] = {"enum": [None, []], "description": "Not implemented: tools."}
    else:
        props["dimensions"] = {"type": "null", "description": props["dimensions"].get("description", "")}
    if served.preprocess.tenant_from == "user":  # the server refuses a request that names no tenant
        schema["required"] = [*schema.get("required", []), "user"]
    extra = served.preprocess.input_schema
    for name in (extra or {}).get("properties", {}):
        props.setdefault(name, {})
    ignore = served.preprocess.unknown_fields == "ignore"
    _close_objects(schema, ignore)
    if ignore:
        schema["description"] = (
            schema.get("description", "")
            + " Fields outside the API are dropped (named in X-Servegate-Ignored-Fields); known harmless ones: "
            + ", ".join(sorted(HARMLESS))
            + "."
        ).strip()
    rules = _cross_field_rules(endpoint) if endpoint != "embeddings" else []
    if extra:
        rules.append({k: v for k, v in extra.items() if k != "$schema"})
    if rules:
        schema["allOf"] = rules
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"{served.name} {endpoint} request"
    return schema

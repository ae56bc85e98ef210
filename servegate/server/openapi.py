"""The published OpenAPI document (GET /openapi.json): every route with its real request and response schemas.

The routes read the raw request (decode -> parse -> tenant), so FastAPI alone would publish no bodies. Here
the request bodies come from `request_json_schema` (the same pydantic models, limits and field policy that
validate every request), the responses from the response models, and every status a route can answer, with
its content type, from the error catalogue and the manifest (overload status, tenant header).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode

from servegate.contracts.manifest import ServedModel
from servegate.contracts.request_models import Endpoint
from servegate.contracts.requests import request_json_schema
from servegate.contracts.responses import (
    AsyncStatus,
    ChatCompletionResponse,
    CompletionResponse,
    EmbeddingResponse,
    ErrorBody,
    ModelList,
)
from servegate.contracts.tokenizer_api import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizePromptRequest,
    TokenizeResponse,
    TokenizerInfo,
)

_API: dict[str, Endpoint] = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
}
_STREAMED = {"/v1/completions", "/v1/chat/completions"}
_POLL_ID = "poll_async_result"


class _Schemas:
    """Components of the document: JSON Schemas with their $defs moved under components/schemas."""

    def __init__(self, components: dict[str, Any]) -> None:
        self.components = components

    def add(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The schema, its local references pointing into the document's components."""
        schema = {k: v for k, v in schema.items() if k != "$schema"}
        defs = schema.pop("$defs", {})
        moved = json.loads(json.dumps(defs).replace('"#/$defs/', '"#/components/schemas/'))
        for name, definition in moved.items():
            self.components.setdefault(name, definition)  # the request contract's (policy-closed) version wins
        return json.loads(json.dumps(schema).replace('"#/$defs/', '"#/components/schemas/'))

    def model(self, model: type[BaseModel], mode: JsonSchemaMode = "serialization") -> dict[str, Any]:
        """A reference to a pydantic model's schema, added to the components."""
        schema = self.add(model.model_json_schema(mode=mode, ref_template="#/components/schemas/{model}"))
        self.components.setdefault(model.__name__, schema)
        return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(schemas: _Schemas, statuses: dict[int, str]) -> dict[str, Any]:
    error = schemas.model(ErrorBody)
    return {str(status): _json(error, why) for status, why in sorted(statuses.items())}


def _api_errors(served: ServedModel) -> dict[int, str]:
    overload = served.failure_policy.overload_status
    statuses = {
        400: "invalid_request, unknown_parameter, unsupported_parameter or input_too_long",
        404: "not_found: the model is not served here",
        413: "payload_too_large",
        415: "unsupported_media: the body is not application/json",
        429: "overloaded (Retry-After)",
        500: "internal (an incident id, never request text)",
        502: "invalid_output: the output breaks the declared output schema",
        503: "model_unavailable: loading, failed warm-up or draining (Retry-After)"
        + ("; overloaded (Retry-After)" if overload == 503 else ""),
        504: "deadline_exceeded",
    }
    if overload != 429:
        del statuses[429]  # overload is answered 503 here
    return statuses


def _api_operation(served: ServedModel, schemas: _Schemas, path: str, operation: dict[str, Any]) -> None:
    endpoint = _API[path]
    body = schemas.add(request_json_schema(served, endpoint))
    operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    response: dict[str, type[BaseModel]] = {
        "completions": CompletionResponse,
        "chat": ChatCompletionResponse,
        "embeddings": EmbeddingResponse,
    }
    ok = _json(schemas.model(response[endpoint]), "The answer")
    if path in _STREAMED:
        event = {
            "type": "object",
            "description": "One server-sent event: `data` is a chunk (JSON), an error body (JSON) or `[DONE]`",
            "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
            "required": ["data"],
        }
        ok["content"]["text/event-stream"] = {"schema": event}
        ok["description"] += " (text/event-stream with stream: true: `data: {chunk}` events ending in [DONE])"
    accepted = _json(schemas.model(AsyncStatus), "Accepted (Prefer: respond-async): poll /v1/requests/{id}")
    # The link lets a stateful run (schemathesis) poll what it submitted.
    accepted["links"] = {"poll": {"operationId": _POLL_ID, "parameters": {"request_id": "$response.body#/id"}}}
    operation["responses"] = {"200": ok, "202": accepted, **_errors(schemas, _api_errors(served))}
    prefer = {"type": "string", "examples": ["respond-async"]}
    why = "`respond-async`: answer 202 at once and poll; other preferences are ignored (RFC 7240)"
    operation["parameters"] = [
        {"name": "Prefer", "in": "header", "required": False, "schema": prefer, "description": why},
        *_tenant(served, required=True),
    ]


def _tenant(served: ServedModel, required: bool) -> list[dict[str, Any]]:
    """X-Tenant: required on the API when tenants come from it; optional on polling whenever tenants exist."""
    source = served.preprocess.tenant_from
    if source == "none" or (required and source != "header"):
        return []
    tenant = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[ -~]+$"}
    needed = required and served.preprocess.tenant_from == "header"
    return [{"name": "X-Tenant", "in": "header", "required": needed, "schema": tenant}]


def _closed(schemas: _Schemas, model: type[BaseModel], served: ServedModel) -> dict[str, Any]:
    """A tokenizer request's schema, closed to unknown fields as the manifest's policy says."""
    reference = schemas.model(model, "validation")
    schemas.components[model.__name__]["additionalProperties"] = served.preprocess.unknown_fields == "ignore"
    return reference


def _tokenizer_operations(schemas: _Schemas, paths: dict[str, Any], served: ServedModel, vocab: int | None) -> None:
    refusals = {404: "not_found (model, or an engine without a tokenizer)", 503: "model_unavailable (Retry-After)"}
    posted = {400: "invalid_request, unknown_parameter or unsupported_parameter", 413: "payload_too_large"}
    posted |= {415: "unsupported_media", **refusals}
    tokenize = {
        "anyOf": [_closed(schemas, TokenizePromptRequest, served), _closed(schemas, TokenizeChatRequest, served)]
    }
    detokenize = _closed(schemas, DetokenizeRequest, served)
    if vocab is not None:
        schemas.components["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] = vocab - 1
    routes: dict[str, tuple[dict[str, Any], type[BaseModel], dict[int, str]]] = {
        "/tokenize": (tokenize, TokenizeResponse, posted),
        "/detokenize": (detokenize, DetokenizeResponse, posted),
    }
    for path, (request, response, statuses) in routes.items():
        operation = paths[path]["post"]
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
        operation["responses"] = {"200": _json(schemas.model(response), "The answer"), **_errors(schemas, statuses)}
    info = paths["/tokenizer_info"]["get"]
    info["responses"] = {"200": _json(schemas.model(TokenizerInfo), "The configuration"), **_errors(schemas, refusals)}


def _plain_operations(schemas: _Schemas, paths: dict[str, Any], served: ServedModel) -> None:
    status = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}
    paths["/v1/models"]["get"]["responses"] = {"200": _json(schemas.model(ModelList), "The served model")}
    paths["/health"]["get"]["responses"] = {"200": _json(status, "The process answers")}
    engine = {
        "type": "object",
        "properties": {"engine": {"type": "string"}, "version": {"type": "string"}, "model": {"type": "string"}},
        "required": ["engine", "version", "model"],
    }
    paths["/version"]["get"]["responses"] = {"200": _json(engine, "The engine behind this server and its version")}
    paths["/ready"]["get"]["responses"] = {
        "200": _json(status, "Ready: model loaded, warm-up passed"),
        "503": _json(status, "Not ready, with the reason (Retry-After)"),
    }
    text = {"description": "Prometheus exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}
    paths["/metrics"]["get"]["responses"] = {"200": text}
    answer: dict[str, Any] = {"description": "The finished request's answer or error, as the request would have had it"}
    answer["content"] = {"application/json": {"schema": {"type": "object"}}}
    poll = paths["/v1/requests/{request_id}"]["get"]
    poll["operationId"] = _POLL_ID
    poll["parameters"] = [*poll.get("parameters", []), *_tenant(served, required=False)]
    poll["responses"] = {
        "200": answer,
        "202": _json(schemas.model(AsyncStatus), "Still running (Retry-After)"),
        **_errors(schemas, {404: "not_found: unknown, or its result expired"}),
        **{str(s): answer for s in (400, 429, 500, 502, 503, 504)},
    }


def _bound_token_ids(schema: dict[str, Any], vocab: int) -> None:
    """Token ids in a prompt schema at most the vocabulary's last id."""
    if schema.get("type") == "integer" and "minimum" in schema:
        schema["maximum"] = vocab - 1
    for value in schema.values():
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, dict):
                _bound_token_ids(child, vocab)


def openapi_document(app: FastAPI, served: ServedModel, vocab: int | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of this server: request bodies, responses and statuses filled in.

    `vocab`: the tokenizer's size once the model is loaded (token ids are bounded by it). The routes of the
    other task (/v1/embeddings for a generation model, and the reverse) are left out: they answer 400.
    """
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = _Schemas(document.setdefault("components", {}).setdefault("schemas", {}))
    paths = document["paths"]
    served_paths = (
        {"/v1/embeddings"} if served.preprocess.task == "embed" else {"/v1/completions", "/v1/chat/completions"}
    )
    for path in set(_API) - served_paths:
        paths.pop(path, None)
    for path, item in paths.items():
        for operation in item.values():
            operation.pop("responses", None)
            if path in _API:
                _api_operation(served, schemas, path, operation)
    if vocab is not None and "/v1/completions" in paths:
        body = paths["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        _bound_token_ids(body["properties"]["prompt"], vocab)
    _tokenizer_operations(schemas, paths, served, vocab)
    _plain_operations(schemas, paths, served)
    paths.pop("/openapi.json", None)
    return document

"""The published OpenAPI document, without a server: real bodies, responses and statuses per route."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from servegate.contracts.manifest import ServedModel
from servegate.server import create_app
from servegate.server.openapi import openapi_document

SERVED = ServedModel.model_validate(
    {"name": "m", "weights": {"source": "zoo:tiny-primary"}, "preprocess": {"tenant_from": "header"}}
)


class _NoEngine:
    """Only `served` is read while the document is built."""

    preprocessor = None  # nothing loaded: the document bounds no token ids
    tokenizer = None

    def __init__(self, served: ServedModel) -> None:
        self.served = served


def _document(served: ServedModel = SERVED, vocab: int | None = None) -> dict[str, Any]:
    return openapi_document(create_app(served, engine=_NoEngine(served)), served, vocab)  # type: ignore[arg-type]


def _body_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


def _validate(document: dict[str, Any], path: str, body: dict[str, Any]) -> None:
    # The components sit at the schema's root, so its "#/components/schemas/..." references resolve in place.
    jsonschema.Draft202012Validator(_body_schema(document, path)).validate(body)


def test_every_generation_route_documents_its_body_answers_and_statuses() -> None:
    document = _document()
    assert "/v1/embeddings" not in document["paths"]  # a generation model: that route only answers 400
    for path in ("/v1/completions", "/v1/chat/completions"):
        operation = document["paths"][path]["post"]
        assert set(operation["responses"]) == {
            "200",
            "202",
            "400",
            "404",
            "413",
            "415",
            "429",
            "500",
            "502",
            "503",
            "504",
        }
        assert set(operation["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        assert {p["name"]: p["required"] for p in operation["parameters"]} == {"Prefer": False, "X-Tenant": True}
        assert operation["responses"]["202"]["links"]["poll"]["operationId"] == "poll_async_result"
    assert document["paths"]["/metrics"]["get"]["responses"]["200"]["content"] == {
        "text/plain": {"schema": {"type": "string"}}
    }
    assert set(document["paths"]["/tokenize"]["post"]["responses"]) == {"200", "400", "404", "413", "415", "503"}


def test_the_documented_bodies_are_the_request_contract() -> None:
    document = _document(vocab=100)
    _validate(document, "/v1/completions", {"model": "m", "prompt": [[1, 2], [3]], "n": 2})
    refused = [
        {"model": "m", "prompt": "x", "colour": 1},
        {"model": "m", "prompt": [[100]]},
        {"model": "m", "prompt": "x", "max_tokens": 0},  # max_tokens 0 only with echo: true
        {"model": "m", "prompt": "x", "stream_options": {}},
    ]
    for bad in refused:
        with pytest.raises(jsonschema.ValidationError):
            _validate(document, "/v1/completions", bad)
    with pytest.raises(jsonschema.ValidationError):
        _validate(document, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                      "top_logprobs": 2})  # fmt: skip
    _validate(document, "/detokenize", {"tokens": [0, 99]})
    with pytest.raises(jsonschema.ValidationError):
        _validate(document, "/detokenize", {"tokens": [100]})


def test_the_app_serves_the_document_and_allow_on_405() -> None:
    with TestClient(create_app(SERVED, engine=_NoEngine(SERVED))) as client:  # type: ignore[arg-type]
        published = client.get("/openapi.json")
        assert published.status_code == 200 and "/v1/completions" in published.json()["paths"]
        wrong = client.delete("/v1/completions")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert wrong.json()["error"]["code"] == "invalid_request"
        models = client.post("/v1/models")
        assert models.status_code == 405 and models.headers["allow"] == "GET"


def test_the_document_follows_the_manifest() -> None:
    served = SERVED.with_changes(preprocess={"tenant_from": "user"}, failure_policy={"overload_status": 503})
    operation = _document(served)["paths"]["/v1/completions"]["post"]
    assert "429" not in operation["responses"] and "overloaded" in operation["responses"]["503"]["description"]
    assert "user" in operation["requestBody"]["content"]["application/json"]["schema"]["required"]
    assert [p["name"] for p in operation["parameters"]] == ["Prefer"]
    embed = SERVED.with_changes(preprocess={"task": "embed"})
    assert set(_document(embed)["paths"]) >= {"/v1/embeddings"}
    assert "/v1/completions" not in _document(embed)["paths"]

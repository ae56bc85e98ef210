"""Fuzzing request validation: any body is either a valid request or one catalogued client error (4xx).

`decode_body` + `parse_request` (the code every endpoint and `gate run` use) get random bytes, broken JSON,
random JSON objects over the real field names, and one-field mutations of valid requests, for the three
endpoints under several manifests (tenants, an extra input_schema, unknown fields ignored, logprobs off).
The hand-written invalid classes are in tests/server/test_request_contract.py and test_api.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servegate.contracts.errors import CATALOGUE, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.requests import decode_body, parse_request

pytestmark = pytest.mark.reliability

FAST_EXAMPLES, SLOW_EXAMPLES = 250, 4000
BASE = {"name": "m", "weights": {"source": "zoo:tiny-primary"}}
MANIFESTS = {
    "default": ServedModel.model_validate(BASE),
    "tenants+logprobs": ServedModel.model_validate(
        {**BASE, "preprocess": {"tenant_from": "user"}, "postprocess": {"logprobs": True, "max_output_tokens": 8}}
    ),
    "input_schema": ServedModel.model_validate(
        {
            **BASE,
            "preprocess": {
                "input_schema": {
                    "type": "object",
                    "required": ["metadata"],
                    "properties": {"metadata": {"type": "object", "properties": {"team": {"type": "string"}}}},
                }
            },
        }
    ),
    "unknown ignored": ServedModel.model_validate({**BASE, "preprocess": {"unknown_fields": "ignore"}}),
    "embed": ServedModel.model_validate(
        {**BASE, "preprocess": {"task": "embed", "max_input_tokens": 64}, "runtime": {"max_model_len": 64}}
    ),
}
FIELDS = [
    "model", "prompt", "messages", "input", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "seed", "stop", "stream", "stream_options", "n", "logprobs", "top_logprobs", "user", "encoding_format",
    "dimensions", "metadata", "role", "content", "text", "type", "name", "include_usage",
]  # fmt: skip
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16)
    | st.sampled_from(["m", "user", "text", "\ud800", "\x00", "\u202e", "a" * 300, "float", "base64", "system"])
)
JSON = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=5)
    ),  # fmt: skip
    max_leaves=20,
)
VALID = {
    "completions": {"model": "m", "prompt": "hello", "max_tokens": 4, "temperature": 0},
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "embeddings": {"model": "m", "input": ["a", "b"]},
}


def outcome_of(served: ServedModel, endpoint: str, raw: bytes) -> str:
    """Decode and parse one body; the outcome is "valid" or the catalogued code (anything else fails the test)."""
    try:
        parse_request(served, endpoint, decode_body(raw))  # type: ignore[arg-type]
    except ServingError as error:
        spec = CATALOGUE[error.code]
        assert spec.client_error and 400 <= error.status < 500, f"{error.code} ({error.status}) for a client's body"
        body = error.to_body()
        json.dumps(body)  # the error body itself is always serializable
        assert body["error"]["message"], "an error without a message"
        assert error.param is None or isinstance(error.param, str)
        return error.code
    return "valid"


def _dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


def _mutate(body: dict[str, Any], field: str, value: Any, drop: bool) -> dict[str, Any]:
    out = dict(body)
    if drop and field in out:
        del out[field]
    else:
        out[field] = value
    return out


def _fuzz(budget: int, figures: Any, label: str, body: Any, **strategies: Any) -> None:
    outcomes: dict[str, int] = {}

    @settings(max_examples=budget, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(**strategies)
    def run(**drawn: Any) -> None:
        for name, result in body(**drawn):
            outcomes[name + ": " + result] = outcomes.get(name + ": " + result, 0) + 1

    run()
    figures.count(f"{label}: cases", sum(outcomes.values()))
    figures.set(
        f"{label}: outcomes", ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items(), key=lambda i: -i[1])[:6])
    )
    figures.count("server-side (5xx) outcomes", 0)


BUDGETS = [pytest.param(FAST_EXAMPLES, id="fast"), pytest.param(SLOW_EXAMPLES, id="long", marks=pytest.mark.slow)]
ENDPOINTS = st.sampled_from(["completions", "chat", "embeddings"])
MANIFEST_NAMES = st.sampled_from(sorted(MANIFESTS))


@pytest.mark.parametrize("budget", BUDGETS)
def test_random_bytes_and_broken_json_are_client_errors(figures: Any, budget: int) -> None:
    def body(raw: bytes, endpoint: str, name: str) -> list[tuple[str, str]]:
        return [(endpoint, outcome_of(MANIFESTS[name], endpoint, raw))]

    broken = st.sampled_from(
        [
            b"",
            b"{",
            b"[]",
            b"null",
            b"1e999",
            b'{"model": "m"',
            b'{"a": NaN}',
            b"\xff\xfe{}",
            b'{"model": "\\ud800"}',
            b"[" * 5000 + b"]" * 5000,
            b'{"x":' * 3000 + b"1" + b"}" * 3000,
            b'{"model":"m","model":"n"}',
        ]  # fmt: skip
    )
    _fuzz(
        budget,
        figures,
        "raw bodies",
        body,
        raw=st.binary(max_size=64) | broken,
        endpoint=ENDPOINTS,
        name=MANIFEST_NAMES,
    )


@pytest.mark.parametrize("budget", BUDGETS)
def test_random_json_objects_are_valid_or_catalogued(figures: Any, budget: int) -> None:
    def body(data: dict[str, Any], endpoint: str, name: str) -> list[tuple[str, str]]:
        return [(endpoint, outcome_of(MANIFESTS[name], endpoint, _dumps(data)))]

    objects = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8)
    _fuzz(budget, figures, "random JSON objects", body, data=objects, endpoint=ENDPOINTS, name=MANIFEST_NAMES)


@pytest.mark.parametrize("budget", BUDGETS)
def test_one_field_mutations_of_valid_requests_are_valid_or_catalogued(figures: Any, budget: int) -> None:
    def body(endpoint: str, name: str, edits: list[tuple[str, Any, bool]]) -> list[tuple[str, str]]:
        data = dict(VALID[endpoint])
        for field, value, drop in edits:
            data = _mutate(data, field, value, drop)
        return [(endpoint, outcome_of(MANIFESTS[name], endpoint, _dumps(data)))]

    edits = st.lists(st.tuples(st.sampled_from(FIELDS), JSON, st.booleans()), min_size=1, max_size=3)
    _fuzz(budget, figures, "mutated valid requests", body, endpoint=ENDPOINTS, name=MANIFEST_NAMES, edits=edits)


@pytest.mark.parametrize("value", [[1], "many", {"a": 1}, 10**9])
def test_an_ignored_chat_field_on_a_completion_is_not_judged(value: Any) -> None:
    """Found by the fuzzer: with unknown_fields: ignore, a completion carrying the chat-only max_completion_tokens
    crashed the cap check (a list compared with an int: a 500 at the server). A field servegate does not know on
    this endpoint is now refused under either policy: a catalogued 400, never a crash."""
    raw = _dumps({"model": "m", "prompt": "x", "max_completion_tokens": value})
    assert outcome_of(MANIFESTS["unknown ignored"], "completions", raw) == "unknown_parameter"


@pytest.mark.parametrize("field", ["max_tokens", "top_k", "seed"])
def test_a_body_the_published_schema_accepts_is_not_refused_for_its_types(field: str) -> None:
    """Found by the fuzzer: JSON Schema's integer admits 12.0, which the strict parser used to refuse."""
    import jsonschema

    from servegate.contracts.requests import request_json_schema

    served = MANIFESTS["default"]
    body = {"model": "m", "prompt": "x", field: 12.0}
    assert not list(jsonschema.Draft202012Validator(request_json_schema(served, "completions")).iter_errors(body))
    assert outcome_of(served, "completions", _dumps(body)) == "valid"


@pytest.mark.parametrize("value", [12.5, "12", True])
def test_integer_fields_stay_strict_about_everything_but_whole_floats(value: Any) -> None:
    raw = _dumps({"model": "m", "prompt": "x", "max_tokens": value})
    assert outcome_of(MANIFESTS["default"], "completions", raw) == "invalid_request"

"""The request contract without a server: parse_request's errors, and the JSON Schema agreeing with it."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.requests import decode_body, parse_request, request_json_schema
from servegate.contracts.responses import RESPONSE_MODELS, response_json_schema

SERVED = ServedModel.model_validate(
    {
        "name": "m",
        "weights": {"source": "zoo:tiny-primary"},
        "postprocess": {"max_output_tokens": 32},
        "runtime": {"max_model_len": 2048},
    }
)
CMPL = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
EMB = {"model": "m", "input": "hi"}

VALID = [
    ("completions", CMPL),
    ("completions", {**CMPL, "prompt": ["one prompt"], "max_tokens": 32, "temperature": 0, "seed": 7, "stop": "x"}),
    ("completions", {**CMPL, "prompt": [5, 6, 7], "top_p": 0.5, "top_k": 3, "stop": ["a", "b"], "n": 1}),
    ("completions", {**CMPL, "prompt": ["one", "two", "three"], "n": 2}),
    ("completions", {**CMPL, "prompt": [[1, 20, 22]]}),
    ("completions", {**CMPL, "prompt": [[1, 20, 22], [5]], "echo": False, "best_of": 1, "logit_bias": {}}),
    ("completions", {**CMPL, "prompt": [[1.0, 2.0]]}),
    ("chat", {**CHAT, "n": 4, "presence_penalty": 0, "tools": [], "tool_choice": "none"}),
    ("completions", {**CMPL, "stream": True, "stream_options": {"include_usage": True}, "user": "u1"}),
    ("completions", {**CMPL, "prompt": "tabs\tand\nnewlines are fine"}),
    ("chat", CHAT),
    (
        "chat",
        {
            **CHAT,
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "a"}]},
            ],
        },
    ),
    ("chat", {**CHAT, "max_completion_tokens": 4}),
    ("embeddings", EMB),
    ("embeddings", {**EMB, "input": ["a", "b"], "encoding_format": "base64"}),
]

# (endpoint, body, code, param, the JSON Schema can say it too)
INVALID: list[tuple[str, dict[str, Any], str, str | None, bool]] = [
    ("completions", {"model": "m"}, "invalid_request", "prompt", True),
    ("completions", {"prompt": "hi"}, "invalid_request", "model", True),
    ("completions", {**CMPL, "prompt": 5}, "invalid_request", "prompt", True),
    ("completions", {**CMPL, "prompt": ""}, "invalid_request", "prompt", True),
    ("completions", {**CMPL, "prompt": []}, "invalid_request", "prompt", True),
    ("completions", {**CMPL, "prompt": ["a"] * 17}, "invalid_request", "prompt", True),
    ("completions", {**CMPL, "prompt": [[1, 2], []]}, "invalid_request", "prompt[1]", True),
    ("completions", {**CMPL, "prompt": [[1, -2]]}, "invalid_request", "prompt[0][1]", True),
    ("completions", {**CMPL, "prompt": [1, "a"]}, "invalid_request", "prompt[0]", True),
    ("completions", {**CMPL, "prompt": ["a", ""]}, "invalid_request", "prompt[1]", True),
    ("completions", {**CMPL, "prompt": ["a"] * 9, "n": 2}, "invalid_request", "n", False),
    ("completions", {**CMPL, "prompt": [1, -2]}, "invalid_request", "prompt[1]", True),
    ("completions", {**CMPL, "prompt": "a\u0000b"}, "invalid_request", "prompt", True),
    ("completions", {**CMPL, "prompt": "bell\u0007"}, "invalid_request", "prompt", True),
    ("completions", {**CMPL, "max_tokens": "5"}, "invalid_request", "max_tokens", True),
    ("completions", {**CMPL, "max_tokens": 0}, "invalid_request", "max_tokens", True),
    ("completions", {**CMPL, "max_tokens": 33}, "invalid_request", "max_tokens", True),
    ("completions", {**CMPL, "max_tokens": 2.5}, "invalid_request", "max_tokens", True),
    ("completions", {**CMPL, "temperature": -0.1}, "invalid_request", "temperature", True),
    ("completions", {**CMPL, "temperature": 2.5}, "invalid_request", "temperature", True),
    ("completions", {**CMPL, "temperature": "hot"}, "invalid_request", "temperature", True),
    ("completions", {**CMPL, "top_p": 0}, "invalid_request", "top_p", True),
    ("completions", {**CMPL, "top_k": -1}, "invalid_request", "top_k", True),
    ("completions", {**CMPL, "seed": -1}, "invalid_request", "seed", True),
    ("completions", {**CMPL, "stop": ["a", "b", "c", "d", "e"]}, "invalid_request", "stop", True),
    ("completions", {**CMPL, "stop": ["a", ""]}, "invalid_request", "stop[1]", True),
    ("completions", {**CMPL, "stream": "yes"}, "invalid_request", "stream", True),
    ("completions", {**CMPL, "stream_options": {"include_usage": True}}, "invalid_request", "stream_options", False),
    (
        "completions",
        {**CMPL, "stream": True, "stream_options": {"x": 1}},
        "unknown_parameter",
        "stream_options.x",
        True,
    ),
    ("completions", {**CMPL, "n": 17}, "invalid_request", "n", True),
    ("completions", {**CMPL, "best_of": 3}, "unsupported_parameter", "best_of", True),
    ("completions", {**CMPL, "logit_bias": {"five": 10}}, "invalid_request", "logit_bias.five", True),
    ("completions", {**CMPL, "logit_bias": {"5": "up"}}, "invalid_request", "logit_bias.5", True),
    ("completions", {**CMPL, "min_tokens": 17}, "invalid_request", "min_tokens", False),  # over max_tokens 16
    ("completions", {**CMPL, "min_p": 1.5}, "invalid_request", "min_p", True),
    ("completions", {**CMPL, "repetition_penalty": 0}, "invalid_request", "repetition_penalty", True),
    ("completions", {**CMPL, "stop_token_ids": [-1]}, "invalid_request", "stop_token_ids[0]", True),
    ("chat", {**CHAT, "presence_penalty": 2.5}, "invalid_request", "presence_penalty", True),
    ("completions", {**CMPL, "suffix": "end"}, "unsupported_parameter", "suffix", True),
    ("completions", {**CMPL, "metadata": {"k": "v"}}, "unknown_parameter", "metadata", True),
    (
        "completions",
        {**CMPL, "stream": True, "stream_options": {"continuous_usage_stats": True}},
        "unknown_parameter",
        "stream_options.continuous_usage_stats",
        True,
    ),
    ("completions", {**CMPL, "logprobs": 2}, "invalid_request", "logprobs", True),
    ("completions", {**CMPL, "frequency_penalty": -2.01}, "invalid_request", "frequency_penalty", True),
    ("completions", {**CMPL, "colour": "blue"}, "unknown_parameter", "colour", True),
    ("completions", {**CMPL, "user": ""}, "invalid_request", "user", True),
    ("completions", {**CMPL, "model": "other"}, "not_found", "model", True),
    ("chat", {"model": "m"}, "invalid_request", "messages", True),
    ("chat", {**CHAT, "messages": []}, "invalid_request", "messages", True),
    ("chat", {**CHAT, "messages": "hi"}, "invalid_request", "messages", True),
    ("chat", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "invalid_request", "messages[0].role", True),
    ("chat", {**CHAT, "messages": [{"role": "user"}]}, "invalid_request", "messages[0].content", True),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": 3}]}, "invalid_request", "messages[0].content", True),
    (
        "chat",
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "invalid_request",
        "messages[0].content[0].type",
        True,
    ),
    (
        "chat",
        {
            **CHAT,
            "messages": [
                {
                    "role": "assistant",
                    "content": "x",
                    "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            ],
        },
        "unsupported_parameter",
        "messages[0].tool_calls",
        True,
    ),
    ("chat", {**CHAT, "max_tokens": 2, "max_completion_tokens": 2}, "invalid_request", "max_tokens", False),
    ("chat", {**CHAT, "max_completion_tokens": 99}, "invalid_request", "max_completion_tokens", True),
    ("chat", {**CHAT, "logprobs": True}, "invalid_request", "logprobs", True),
    ("chat", {**CHAT, "top_logprobs": 2}, "invalid_request", "top_logprobs", False),
    ("embeddings", {"model": "m"}, "invalid_request", "input", True),
    ("embeddings", {**EMB, "input": ""}, "invalid_request", "input", True),
    ("embeddings", {**EMB, "input": ["a", ""]}, "invalid_request", "input[1]", True),
    ("embeddings", {**EMB, "input": [1, 2]}, "invalid_request", "input[0]", True),
    ("embeddings", {**EMB, "encoding_format": "int8"}, "invalid_request", "encoding_format", True),
    ("embeddings", {**EMB, "dimensions": 4}, "invalid_request", "dimensions", True),
]


@pytest.mark.parametrize(("endpoint", "body"), VALID)
def test_valid_requests_pass_both_the_parser_and_the_schema(endpoint: str, body: dict[str, Any]) -> None:
    parse_request(SERVED, endpoint, body)  # type: ignore[arg-type]
    jsonschema.validate(body, request_json_schema(SERVED, endpoint))  # type: ignore[arg-type]


@pytest.mark.parametrize(("endpoint", "body", "code", "param", "in_schema"), INVALID)
def test_invalid_requests_name_code_and_param(
    endpoint: str, body: dict[str, Any], code: str, param: str | None, in_schema: bool
) -> None:
    with pytest.raises(ServingError) as caught:
        parse_request(SERVED, endpoint, body)  # type: ignore[arg-type]
    error = caught.value
    assert (error.code, error.param) == (code, param), error.message
    assert error.status == (404 if code == "not_found" else 400)
    assert error.message and "{" not in error.message  # the template was filled
    if in_schema:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(body, request_json_schema(SERVED, endpoint))  # type: ignore[arg-type]


def test_messages_say_what_to_change() -> None:
    with pytest.raises(ServingError, match=r"max_tokens: must be <= 32, this model's max_output_tokens \(got 33\)"):
        parse_request(SERVED, "completions", {**CMPL, "max_tokens": 33})
    with pytest.raises(ServingError, match=r"n: at most 16 choices per request \(preprocess.max_choices_per_request\)"):
        parse_request(SERVED, "completions", {**CMPL, "n": 17})
    with pytest.raises(ServingError, match="best_of samples several completions and returns the likeliest"):
        parse_request(SERVED, "completions", {**CMPL, "best_of": 3})
    with pytest.raises(ServingError, match="preprocess.unknown_fields: ignore accepts and drops it"):
        parse_request(SERVED, "completions", {**CMPL, "store": False})
    with pytest.raises(ServingError, match="'messages' is required"):
        parse_request(SERVED, "chat", {"model": "m"})


@pytest.mark.parametrize(
    ("raw", "fragment", "param"),
    [
        (b'{"model": "m", "prompt": ', "not valid JSON", None),
        (b"\xff\xfe{}", "not valid UTF-8", None),
        (b"[1, 2]", "must be a JSON object (got list)", None),
        (b'"just a string"', "must be a JSON object (got str)", None),
        (b'{"prompt": "\\ud800 lone surrogate"}', "unpaired surrogate", "prompt"),
        (b'{"messages": [{"content": "\\udfff"}]}', "unpaired surrogate", "messages[0].content"),
        (b'{"prompt": "raw \x01 control"}', "not valid JSON", None),
        (b"[" * 100_000 + b"]" * 100_000, "", None),
    ],
)
def test_decode_body_refuses_what_is_not_a_json_object_of_valid_text(
    raw: bytes, fragment: str, param: str | None
) -> None:
    with pytest.raises(ServingError) as caught:
        decode_body(raw)
    assert caught.value.code == "invalid_request" and caught.value.status == 400
    assert fragment in caught.value.message and caught.value.param == param


def test_unknown_fields_can_be_ignored_by_policy() -> None:
    lenient = SERVED.with_changes(preprocess={"unknown_fields": "ignore"})
    parse_request(lenient, "completions", {**CMPL, "frequency_penalty": 0.0, "metadata": {"k": "v"}})
    with pytest.raises(ServingError, match="not known to be harmless"):  # dropping an unknown field is no safer
        parse_request(lenient, "completions", {**CMPL, "colour": "blue"})
    assert request_json_schema(lenient, "completions")["additionalProperties"] is True
    assert request_json_schema(SERVED, "completions")["additionalProperties"] is False


def test_input_schema_is_enforced_and_merged_into_the_exported_schema() -> None:
    extra = {
        "type": "object",
        "required": ["user"],
        "properties": {"user": {"pattern": "^team-"}, "metadata": {"type": "object"}},
    }
    strict = SERVED.with_changes(preprocess={"input_schema": extra})
    with pytest.raises(ServingError) as caught:
        parse_request(strict, "completions", CMPL)
    assert (caught.value.code, caught.value.param) == ("invalid_request", "user")
    with pytest.raises(ServingError) as caught:
        parse_request(strict, "completions", {**CMPL, "user": "solo"})
    assert caught.value.param == "user" and "team-" in caught.value.message
    # A field the deployment's own schema declares is not "unknown".
    parse_request(strict, "completions", {**CMPL, "user": "team-a", "metadata": {"k": 1}})
    schema = request_json_schema(strict, "completions")
    jsonschema.validate({**CMPL, "user": "team-a", "metadata": {}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**CMPL, "user": "solo"}, schema)


def test_schema_bakes_in_the_manifest_limits() -> None:
    schema = request_json_schema(SERVED, "completions")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["max_tokens"]["maximum"] == 32
    assert schema["properties"]["model"]["const"] == "m"
    bigger = SERVED.with_changes(postprocess={"max_output_tokens": 100, "logprobs": True})
    assert request_json_schema(bigger, "chat")["properties"]["max_tokens"]["anyOf"][0]["maximum"] == 100
    parse_request(bigger, "completions", {**CMPL, "max_tokens": 100, "logprobs": 2})


@pytest.mark.parametrize("name", sorted(RESPONSE_MODELS))
def test_response_schemas_are_valid_json_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(response_json_schema(name))


def test_every_prompt_form_parses_to_a_list_of_prompts() -> None:
    forms = {
        "text": ["text"],
        ("text",): ["text"],
        ("a", "b"): ["a", "b"],
        (1, 2, 3): [[1, 2, 3]],
        ((1, 2), (3,)): [[1, 2], [3]],
    }
    for sent, prompts in forms.items():
        body = json_list(sent)
        assert parse_request(SERVED, "completions", {**CMPL, "prompt": body}).prompts() == prompts  # type: ignore[union-attr]


def json_list(value: Any) -> Any:
    """Tuples (hashable dict keys above) as the JSON lists a client sends."""
    return [json_list(v) for v in value] if isinstance(value, tuple) else value


def test_ignore_drops_harmless_and_unknown_fields_at_every_depth_and_names_them() -> None:
    lenient = SERVED.with_changes(preprocess={"unknown_fields": "ignore"})
    body = {
        **CHAT,
        "messages": [{"role": "assistant", "content": "x", "refusal": None}, {"role": "user", "content": "y"}],
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "metadata": {"k": "v"},
    }
    parsed = parse_request(lenient, "chat", body)
    assert parsed.dropped_fields() == [
        "metadata",
        "stream_options.continuous_usage_stats",
        "messages[0].refusal",
    ]
    jsonschema.validate(body, request_json_schema(lenient, "chat"))
    for unsupported in (
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"response_format": {"type": "json_object"}},
        {"functions": [{"name": "f"}]},
    ):
        with pytest.raises(ServingError) as caught:
            parse_request(lenient, "chat", {**CHAT, **unsupported})
        assert caught.value.code == "unsupported_parameter" and caught.value.param == next(iter(unsupported))
    with pytest.raises(ServingError) as caught:
        parse_request(lenient, "completions", {**CMPL, "best_of": 3, "logprobs": 1, "max_tokens": 1})
    assert caught.value.code == "unsupported_parameter" and caught.value.param == "best_of"


def test_reject_refuses_nested_unknown_fields_with_their_path() -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "cache": 1}]}]}
    with pytest.raises(ServingError) as caught:
        parse_request(SERVED, "chat", body)
    assert (caught.value.code, caught.value.param) == ("unknown_parameter", "messages[0].content[0].cache")


def test_choices_limit_follows_the_manifest() -> None:
    single = SERVED.with_changes(preprocess={"max_choices_per_request": 1})
    with pytest.raises(ServingError) as caught:
        parse_request(single, "completions", {**CMPL, "prompt": ["a", "b"]})
    assert caught.value.param == "prompt" and "got 2 prompts" in caught.value.message
    with pytest.raises(ServingError) as caught:
        parse_request(single, "chat", {**CHAT, "n": 2})
    assert caught.value.param == "n"
    schema = request_json_schema(single, "completions")
    assert schema["properties"]["n"]["maximum"] == 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**CMPL, "prompt": ["a", "b"]}, schema)

"""Function calling through the API on the reference engine (the zoo's tiny-primary, a short tools template):
forced calls always parse in every batching mode, `auto` calls are read by the declared parser (streamed and
not, the same), a malformed call gets on_invalid_output, and every bad tool field is a declared 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from support.manifests import BATCHING_MODES, merged_manifest, real_manifest, write_manifest
from support.servers import ready_app
from transformers import AutoTokenizer

from servegate.contracts.errors import ServegateError
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.runtime.preprocess import Preprocessor
from servegate.zoo import zoo_model_path

pytest.importorskip("llguidance")

TEMPLATE = (
    "{%- if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}\n{% endfor %}assistant:"
)
DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
ADD = {
    "type": "object",
    "properties": {"a": DIGIT, "b": DIGIT},
    "required": ["a", "b"],
    "additionalProperties": False,
}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two digits", "parameters": ADD}},
    {"type": "function", "function": {"name": "weather", "parameters": CITY}},
]
SCHEMAS = {"add": ADD, "weather": CITY}
CALL = r'<tool_call>\{"name": "add", "arguments": \{"a": [0-9], "b": [0-9]\}\}</tool_call>'


def serve(folder: Path, tools: dict[str, Any] | None = None, **sections: Any) -> ServedModel:
    """tiny-primary behind the short tools template, with structured output (compact JSON) and tools declared."""
    (folder / "tools.jinja").write_text(TEMPLATE)
    post = {"max_output_tokens": 100, "structured_output": {"whitespace": "compact"}, "tools": tools or {}}
    manifest = real_manifest(
        "zoo:tiny-primary",
        preprocess={"chat_template": "tools.jinja", "max_input_tokens": 128, "max_payload_bytes": 16384},
        runtime={"max_model_len": 256, "threads": 1, "kv_cache": {"block_size": 16, "memory_budget": "8MiB"}},
        postprocess=post,
    )
    return load_manifest(write_manifest(folder, merged_manifest(manifest, **sections)))


def ready(served: ServedModel) -> Iterator[TestClient]:
    yield from ready_app(served)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    yield from ready(serve(tmp_path_factory.mktemp("tools")))


def chat(client: TestClient, **fields: Any) -> Any:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "3+4?"}], "tools": TOOLS, **fields}
    return client.post("/v1/chat/completions", json={"max_tokens": 100, "temperature": 0, **body})


def streamed(client: TestClient, **fields: Any) -> dict[str, Any]:
    """A streamed chat answer put together as the openai client does: content joined, calls by index."""
    answer = chat(client, stream=True, **fields)
    assert answer.status_code == 200, answer.text
    content, calls, reason = "", {}, None
    for line in answer.text.splitlines():
        if not line.startswith("data: {"):
            continue
        choice = json.loads(line[6:])["choices"][0]
        content += choice["delta"].get("content") or ""
        for call in choice["delta"].get("tool_calls") or []:
            calls[call["index"]] = call
        reason = choice["finish_reason"] or reason
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": reason}


def assert_valid_calls(calls: list[dict[str, Any]]) -> None:
    assert calls
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


@pytest.mark.parametrize("mode", list(BATCHING_MODES))
def test_forced_calls_always_parse_in_every_batching_mode(tmp_path: Path, mode: str) -> None:
    sections = BATCHING_MODES[mode]
    for client in ready(serve(tmp_path, **sections)):
        required = chat(client, tool_choice="required", parallel_tool_calls=False).json()
        for choice in required["choices"]:
            assert choice["finish_reason"] == "tool_calls", choice
            assert choice["message"]["content"] is None
            assert len(choice["message"]["tool_calls"]) == 1  # parallel_tool_calls false: one call
            assert_valid_calls(choice["message"]["tool_calls"])
        named = chat(client, tool_choice={"type": "function", "function": {"name": "weather"}}, temperature=1.0, seed=5)
        [choice] = named.json()["choices"]
        assert choice["finish_reason"] == "stop"  # a named call ends as `stop`, as in OpenAI's API and vLLM
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "weather"
        assert_valid_calls([call])


def test_auto_calls_are_read_by_the_parser_streamed_or_not(client: TestClient) -> None:
    regex = {"structured_outputs": {"regex": "ok " + CALL}}
    whole = chat(client, **regex).json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    assert whole["message"]["content"] == "ok "
    assert_valid_calls(whole["message"]["tool_calls"])
    parts = streamed(client, **regex)
    assert parts["content"] == "ok " and parts["finish_reason"] == "tool_calls"
    assert [c["function"] for c in parts["tool_calls"]] == [c["function"] for c in whole["message"]["tool_calls"]]


def test_without_a_call_auto_and_none_answer_in_text_and_the_tools_are_in_the_prompt(client: TestClient) -> None:
    auto = chat(client).json()
    none = chat(client, tool_choice="none").json()
    for answer in (auto, none):
        [choice] = answer["choices"]
        assert "tool_calls" not in choice["message"] and choice["finish_reason"] in ("stop", "length")
    bare = client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "3+4?"}], "max_tokens": 4},
    ).json()
    assert none["usage"]["prompt_tokens"] > bare["usage"]["prompt_tokens"]  # rendered under `none` too, as vLLM


def test_a_conversation_with_earlier_calls_and_their_results_is_rendered(client: TestClient) -> None:
    messages = [
        {"role": "user", "content": "3+4?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [EARLIER],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "7"},
    ]
    answer = chat(client, messages=messages, max_tokens=4)
    assert answer.status_code == 200, answer.text
    shorter = chat(client, messages=messages[:1], max_tokens=4).json()
    assert answer.json()["usage"]["prompt_tokens"] > shorter["usage"]["prompt_tokens"] + len('{"a":3,"b":4}')


@pytest.mark.parametrize("policy", ["error", "flag"])
def test_a_malformed_auto_call_gets_on_invalid_output(tmp_path: Path, policy: str) -> None:
    broken = r'ok <tool_call>\{"name": "add", "arguments": \{"a": 1\}\}</tool_call>'  # b is required
    for client in ready(serve(tmp_path, failure_policy={"on_invalid_output": policy})):
        answer = chat(client, structured_outputs={"regex": broken})
        if policy == "error":
            assert answer.status_code == 502 and answer.json()["error"]["code"] == "invalid_output"
            assert "'b' is a required property" in answer.json()["error"]["message"]
        else:
            assert answer.status_code == 200
            assert answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


EARLIER = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":3,"b":4}'}}
REFUSED = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "tool_choice.function.name"),
    ({"tools": None, "tool_choice": "required"}, 400, "tools"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, 400, "tools[1].function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
        400,
        "tools[0].function.parameters",
    ),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, 400, "tools[0].function.name"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, 400, "tool_choice"),
    ({"tool_choice": "required", "ignore_eos": True}, 400, "ignore_eos"),
    ({"tool_choice": "sometimes"}, 400, "tool_choice"),
    ({"functions": [{"name": "f"}]}, 400, "functions"),
    ({"messages": [{"role": "tool", "content": "7"}]}, 400, "messages[0]"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [EARLIER]}], "tools": None}, 400, "messages[0]"),
]


@pytest.mark.parametrize(("fields", "status", "param"), REFUSED)
def test_every_bad_tool_field_is_a_declared_400(
    client: TestClient, fields: dict[str, Any], status: int, param: str
) -> None:
    answer = chat(client, **fields)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param, answer.json()


def test_limits_and_undeclared_modes_are_refused(tmp_path: Path) -> None:
    for client in ready(serve(tmp_path, tools={"tool_choice": ["none", "auto"], "max_tools": 1})):
        over = chat(client)
        assert over.status_code == 400 and "at most 1 functions" in over.json()["error"]["message"]
        forced = chat(client, tools=TOOLS[:1], tool_choice="required")
        assert forced.status_code == 400 and forced.json()["error"]["code"] == "unsupported_parameter"


def test_manifests_that_cannot_serve_tools_fail_loudly(tmp_path: Path) -> None:
    with pytest.raises(ServegateError, match="structured_output"):
        serve(tmp_path, postprocess={"structured_output": None})
    with pytest.raises(ServegateError, match="chat template"):
        serve(tmp_path, preprocess={"chat_template": "none"})
    (tmp_path / "plain.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    served = serve(tmp_path, preprocess={"chat_template": "plain.jinja"})
    tokenizer = AutoTokenizer.from_pretrained(zoo_model_path("tiny-primary"))
    with pytest.raises(ServegateError, match="does not write the tools into the prompt"):
        Preprocessor(served, tokenizer)

"""Reading tool calls out of an output's text: the hermes parser under `auto`, the forced JSON of `required` and a
named choice, what is wrong with a call that does not parse, and what of a growing output may stream."""

from __future__ import annotations

import json

import pytest

from servegate.contracts.tool_fields import ToolUse
from servegate.runtime.tool_calls import read_tool_calls, streamable_content

ADD = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
FUNCTIONS = (("add", ADD), ("now", '{"type":"object","properties":{}}'))


def use(mode: str = "auto", named: str | None = None) -> ToolUse:
    return ToolUse(mode, "hermes", FUNCTIONS, named)  # type: ignore[arg-type]


def test_hermes_reads_each_call_and_the_content_before_the_first() -> None:
    first = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    text = f'Sure. {first}\n<tool_call>{{"name": "now", "arguments": {{}}}}'
    reading = read_tool_calls(use(), text)
    assert reading.problem is None
    assert reading.content == "Sure. "
    assert [(c.name, json.loads(c.arguments)) for c in reading.calls] == [("add", {"a": 1}), ("now", {})]
    assert reading.calls[0].arguments == '{"a": 1}'  # written back as vLLM does (json.dumps)


def test_text_without_a_call_is_all_content() -> None:
    reading = read_tool_calls(use(), "no calls here")
    assert (reading.content, reading.calls, reading.problem) == ("no calls here", (), None)
    only_call = read_tool_calls(use(), '<tool_call>{"name": "now", "arguments": {}}</tool_call>')
    assert only_call.content is None and len(only_call.calls) == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>', "is not JSON"),
        ('<tool_call>{"name": "add"}</tool_call>', "string name and arguments"),
        ('<tool_call>{"name": "sub", "arguments": {"a": 1}}</tool_call>', "not among the request's tools"),
        ('<tool_call>{"name": "add", "arguments": {"a": "one"}}</tool_call>', "is not of type 'integer'"),
        ('<tool_call>{"name": "add", "arguments": {}}</tool_call>', "'a' is a required property"),
        ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', "not an object"),
    ],
)
def test_a_broken_call_is_named_and_unparsed_ones_leave_the_text_as_content(text: str, says: str) -> None:
    reading = read_tool_calls(use(), "x " + text)
    assert reading.problem is not None and says in reading.problem
    if "JSON" in says or "string name" in says:
        assert reading.content == "x " + text and reading.calls == ()


def test_required_and_named_read_the_forced_json() -> None:
    required = read_tool_calls(use("required"), '[{"name":"add","parameters":{"a":2}},{"name":"now","parameters":{}}]')
    assert required.problem is None and required.content is None
    assert [(c.name, c.arguments) for c in required.calls] == [("add", '{"a": 2}'), ("now", "{}")]
    named = read_tool_calls(use("named", "add"), '{"a":3}')
    assert named.problem is None and [(c.name, c.arguments) for c in named.calls] == [("add", '{"a":3}')]
    assert "not JSON" in (read_tool_calls(use("named", "add"), '{"a":').problem or "")
    assert "not a non-empty list" in (read_tool_calls(use("required"), "[]").problem or "")


def test_streaming_holds_back_what_may_begin_a_call() -> None:
    assert streamable_content(None, "a <tool") == "a <tool"
    assert streamable_content(use(), "a <tool") == "a "
    assert streamable_content(use(), "a <tool_call>{") == "a "
    assert streamable_content(use(), "a < b") == "a < b"
    assert streamable_content(use(), "a <") == "a "
    assert streamable_content(use("required"), "[{") == ""


def test_the_vllm_export_names_the_tool_call_parser_where_auto_is_served() -> None:
    from servegate.contracts.manifest import ServedModel
    from servegate.runtime.remote.vllm_args import engine_args

    def exported(modes: list[str]) -> dict[str, object]:
        served = ServedModel.model_validate(
            {
                "name": "m",
                "weights": {"source": "zoo:tiny-primary"},
                "postprocess": {"structured_output": {}, "tools": {"tool_choice": modes}},
            }
        )
        return engine_args(served, "model").args

    auto = exported(["none", "auto", "required"])
    assert auto["enable-auto-tool-choice"] is True and auto["tool-call-parser"] == "hermes"
    assert "tool-call-parser" not in exported(["none", "required", "named"])  # vLLM forces those without one

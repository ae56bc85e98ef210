"""The note's contract items state what the API does for clients: cache marks, choices, sampling without a seed."""

from __future__ import annotations

from servegate.contracts.manifest import ServedModel
from servegate.model_cards.items_contract import input_contract, output_contract

SERVED = ServedModel.model_validate(
    {
        "name": "m",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"max_choices_per_request": 4},
        "postprocess": {"response_cache": {"enabled": True}},
    }
)


def test_the_output_contract_says_how_a_cache_hit_is_marked() -> None:
    cache = output_contract(SERVED)["response_cache"]
    assert "X-Servegate-Cache" in cache["marked"] and "response_cache" in cache["marked"]
    schema = output_contract(SERVED)["response_schemas"]["completions"]
    assert "response_cache" in schema["properties"]
    assert output_contract(SERVED.with_changes(postprocess={}))["response_cache"] is None


def test_the_input_contract_states_choices_sampling_and_unsupported_fields() -> None:
    item = input_contract(SERVED)
    assert item["limits"]["max_choices_per_request"] == 4
    assert item["unseeded_sampling"] == "fresh"
    assert "unsupported_parameter" in {row["code"] for row in item["errors"]}
    assert "preprocess.unseeded_sampling" in item["request_schemas"]["completions"]["properties"]["seed"]["description"]


def test_the_output_contract_lists_the_tool_calling_served() -> None:
    tooled = SERVED.with_changes(
        preprocess={"chat_template": "tokenizer"},
        postprocess={"structured_output": {}, "tools": {"tool_choice": ["auto", "named"], "max_tools": 8}},
    )
    tools = output_contract(tooled)["tools"]
    assert tools["tool_choice"] == ["auto", "named"] and tools["parser"] == "hermes" and tools["max_tools"] == 8
    assert "grammar engine" in tools["forced_calls"]
    assert output_contract(SERVED)["tools"] is None
    from servegate.model_cards.render_markdown import _tool_calls

    assert _tool_calls(tools).startswith("tool_choice auto, named; calls read by the hermes parser; up to 8 tools")
    assert _tool_calls(None).startswith("not served")

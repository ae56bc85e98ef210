"""The chat suites' metrics (field_accuracy, tool_name_match, tool_arguments_match) on hand-made answers, and the
committed extraction and tools suites: reproducible, their references valid under their own schemas and tools."""

from __future__ import annotations

import json

import jsonschema
import pytest

from servegate.zoo import load_metric, load_suite
from servegate.zoo.chat_suites import CHAT_SUITES, render, suite_file


def score(metric: str, prediction: object, reference: object) -> float:
    text = prediction if isinstance(prediction, str) else json.dumps(prediction)
    return load_metric(metric).compute(predictions=[text], references=[json.dumps(reference)])[metric]


def test_field_accuracy_counts_missing_invented_and_wrongly_typed_fields() -> None:
    expected = {"name": "Ada", "age": 36, "address": {"city": "Oslo"}}
    assert score("field_accuracy", expected, expected) == 1.0
    assert score("field_accuracy", {**expected, "age": 37}, expected) == pytest.approx(2 / 3)
    assert score("field_accuracy", {"name": "Ada", "address": {"city": "Oslo"}}, expected) == pytest.approx(2 / 3)
    assert score("field_accuracy", {**expected, "email": "a@b"}, expected) == pytest.approx(3 / 4)
    assert score("field_accuracy", {**expected, "age": "36"}, expected) == pytest.approx(2 / 3)  # a string is not 36
    assert score("field_accuracy", {**expected, "age": 36.0}, expected) == 1.0  # JSON numbers compare by value
    assert score("field_accuracy", {"flag": 1}, {"flag": True}) == 0.0  # true is not 1
    assert score("field_accuracy", '{"name": "Ada"', expected) == 0.0  # not JSON


def test_tool_metrics_score_the_function_and_each_argument() -> None:
    expected = {"name": "convert_currency", "arguments": {"amount": 10, "source": "USD", "target": "EUR"}}
    right = [expected]
    assert score("tool_name_match", right, expected) == 1.0 and score("tool_arguments_match", right, expected) == 1.0
    last_dropped = [{"name": "convert_currency", "arguments": {"amount": 10, "source": "USD"}}]
    assert score("tool_name_match", last_dropped, expected) == 1.0
    assert score("tool_arguments_match", last_dropped, expected) == pytest.approx(2 / 3)
    other = [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    assert score("tool_name_match", other, expected) == 0.0 and score("tool_arguments_match", other, expected) == 0.0
    twice = [expected, expected]
    assert score("tool_name_match", twice, expected) == 0.0  # a second call was not asked for
    assert score("tool_arguments_match", twice, expected) == 0.5
    assert score("tool_name_match", [], expected) == 0.0 and score("tool_arguments_match", [], expected) == 0.0


@pytest.mark.parametrize("name", CHAT_SUITES)
def test_chat_suites_are_what_their_generator_writes(name: str) -> None:
    assert suite_file(name).read_text(encoding="utf-8") == render(name)


def test_every_reference_satisfies_its_items_schema_or_tool() -> None:
    for row in load_suite("zoo:extraction"):
        jsonschema.validate(json.loads(row["reference"]), json.loads(row["schema"]))
    for row in load_suite("zoo:tools"):
        call = json.loads(row["reference"])
        tools = {t["function"]["name"]: t["function"]["parameters"] for t in json.loads(row["tools"])}
        jsonschema.validate(call["arguments"], tools[call["name"]])
        assert row["tool_choice"] == "required"

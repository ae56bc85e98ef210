"""The hand-written chat suites `zoo:facts` and `zoo:format`: they load, hold the sizes the example's margins rest on,
every item is well formed (no facts answer given away by its question, every format rule checkable), and the
`contains_answer` and `format_followed` metrics score known answers right and wrong; `kind: chat` items are plain
chat requests built by the request translator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.manifests import real_manifest, write_manifest

from servegate.contracts.errors import ManifestError
from servegate.contracts.loading import load_manifest
from servegate.gates.suites.evaluation import load_suite_data
from servegate.zoo import load_metric, load_suite
from servegate.zoo.answer_checks import contains_answer, follows, normalise, parse_rule
from servegate.zoo.eval_suites import WRITTEN_SUITES

SIZES = {"facts": 80, "format": 60}
TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "tools" / "chatml-tools.jinja"


def test_the_written_suites_load_with_their_sizes_and_unique_ids() -> None:
    assert set(WRITTEN_SUITES) == set(SIZES)
    for name, size in SIZES.items():
        rows = load_suite(f"zoo:{name}")
        assert len(rows) == size, name
        assert len({row["id"] for row in rows}) == size and len({row["prompt"] for row in rows}) == size
        assert load_suite(name, limit=8) == rows[:8]


def test_no_facts_answer_is_in_its_question() -> None:
    for row in load_suite("zoo:facts"):
        assert all(normalise(alternative) for alternative in row["reference"].split("|")), row
        assert not contains_answer(row["prompt"], row["reference"]), row  # an echoed question would score


def test_every_format_rule_is_checkable() -> None:
    rules = [parse_rule(row["reference"]) for row in load_suite("zoo:format")]
    assert {rule["rule"] for rule in rules} >= {"uppercase", "lowercase", "integer", "max_words", "one_of"}


def test_contains_answer_matches_whole_words_case_and_punctuation_aside() -> None:
    assert contains_answer("The capital of France is Paris.", "Paris")
    assert contains_answer("**PARIS**", "paris")
    assert contains_answer("It's New-Delhi!", "New Delhi")
    assert contains_answer("A spider has eight legs.", "8|eight")
    assert contains_answer("Water is H2O", "h2o")
    assert not contains_answer("Parisian food", "Paris")
    assert not contains_answer("It is 42.", "4|four")
    assert not contains_answer("New York", "New Delhi")
    assert not contains_answer("", "Paris")
    assert not contains_answer("anything at all", "")  # an empty reference never matches
    assert not contains_answer("anything at all", " ?! | ")


def test_format_rules_on_answers_that_keep_and_break_them() -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"rule": "uppercase"}, "HELLO, WORLD!", "Hello"),
        ({"rule": "uppercase"}, "OK 42", "123"),  # no letters: not an uppercase answer
        ({"rule": "lowercase"}, "banana.", "Banana"),
        ({"rule": "integer"}, " 7.", "7 days"),
        ({"rule": "integer"}, '"-12".', "3.5"),
        ({"rule": "max_words", "n": 3}, "Blue and deep.", "Blue, deep and wide."),
        ({"rule": "max_words", "n": 1}, "Red", ""),
        ({"rule": "exact_words", "n": 3}, "vast, blue, deep", "vast blue"),
        ({"rule": "one_of", "options": ["yes", "no"]}, "Yes.", "Yes, it is."),
        ({"rule": "starts_with", "text": "the answer is"}, "The answer is 2.", "Answer: 2"),
        ({"rule": "contains", "text": "river"}, "The river runs.", "The riverbank."),
        ({"rule": "lines", "n": 3}, "red\n\ngreen\nblue\n", "red, green, blue"),
        ({"rule": "comma_list", "n": 3}, "red, green, blue", "red, green, blue, pink"),
        ({"rule": "comma_list", "n": 2}, "France, Spain.", "France,, Spain"),
    ]
    for rule, kept, broken in cases:
        assert follows(kept, rule), (rule, kept)
        assert not follows(broken, json.dumps(rule)), (rule, broken)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"rule": "shout"}, "unknown format rule 'shout'.*one of uppercase"),
        ({"rule": "max_words"}, "'max_words' needs n"),
        ({"rule": "lines", "n": 0}, "n must be an integer >= 1"),
        ({"rule": "one_of", "options": []}, "options must be a non-empty list of strings"),
        ({"rule": "contains", "text": 3}, "text must be a string"),
        (["uppercase"], "unknown format rule"),
        ('{"rule": "uppercase"', "is not JSON"),
    ],
)
def test_rules_that_cannot_be_checked_are_refused(rule: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        follows("anything", rule)


def test_the_metric_modules_average_the_checks() -> None:
    contains = load_metric("contains_answer")
    result = contains.compute(predictions=["It is Paris.", "Parisian", "four"], references=["paris", "paris", "4|four"])
    assert result == {"contains_answer": pytest.approx(2 / 3)}
    assert contains.compute(predictions=[], references=[]) == {"contains_answer": 0.0}
    followed = load_metric("format_followed")
    rules = [json.dumps({"rule": "uppercase"}), json.dumps({"rule": "integer"})]
    assert followed.compute(predictions=["YES", "seven"], references=rules) == {"format_followed": 0.5}


def chat_manifest(template: str = str(TEMPLATE)) -> dict[str, Any]:
    manifest = real_manifest(
        "zoo:tiny-primary",
        preprocess={"chat_template": template, "max_input_tokens": 512, "max_payload_bytes": 16384},
        runtime={"max_model_len": 640},
        batching={"max_num_batched_tokens": 640},
    )
    manifest["quality"] = {"suites": [{"name": "facts", "dataset": "zoo:facts", "kind": "chat", "limit": 4,
                                       "max_tokens": 24}]}  # fmt: skip
    return manifest


def test_chat_items_are_plain_chat_requests_scored_by_contains_answer(tmp_path: Path) -> None:
    served = load_manifest(write_manifest(tmp_path, chat_manifest()))
    suite = served.quality.suites[0]
    assert suite.metrics == ["contains_answer"]  # the kind's default
    data = load_suite_data(served, suite)
    rows = load_suite("zoo:facts", limit=4)
    assert [item.prompt for item in data.items] == [row["prompt"] for row in rows]
    for item, row in zip(data.items, rows, strict=True):
        request = item.request
        assert request is not None and request.messages is not None
        assert [(m["role"], m["content"]) for m in request.messages] == [("user", row["prompt"])]
        assert request.tools is None and request.params.constraint is None and request.params.tool_use is None
        assert request.params.max_tokens == 24 and request.params.temperature == 0


def test_a_chat_suite_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"quality.suites\[facts\] \(kind: chat\) sends chat requests"):
        load_manifest(write_manifest(tmp_path, chat_manifest("none")))

"""Eval suites: committed files equal their seeded generators, load through datasets, keep their promises."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from servegate.zoo import SPLITS, SUITES, ZooError, json_output_schema, load_suite, suite_path, tasks
from servegate.zoo.suite_generator import generate, render
from servegate.zoo.tokenizer import build_char_tokenizer


def _items(name: str, split: str = "test") -> list[dict]:
    lines = suite_path(name, split).read_text(encoding="ascii").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("name", SUITES)
def test_generators_reproduce_the_committed_files_byte_for_byte(name: str) -> None:
    for split, items in generate(name).items():
        assert render(items).encode("ascii") == suite_path(name, split).read_bytes(), f"{name}.{split}"


@pytest.mark.parametrize("name", SUITES)
def test_splits_are_large_and_disjoint(name: str) -> None:
    test, calibration = _items(name, "test"), _items(name, "calibration")
    assert len(test) >= (250 if name == "similarity" else 500)
    assert len(calibration) >= 100
    assert len({item["id"] for item in test + calibration}) == len(test) + len(calibration)
    assert not {item["prompt"] for item in test} & {item["prompt"] for item in calibration}


def test_similarity_has_at_least_200_labelled_pairs_of_each_kind() -> None:
    items = _items("similarity")
    assert len(items) >= 200
    for item in items:
        assert item["topic"] != item["negative_topic"]
        assert len({item["prompt"], item["reference"], item["negative"]}) == 3


def test_prompt_tokens_are_what_the_tokenizer_counts() -> None:
    tokenizer = build_char_tokenizer()
    for name in ("arith", "recall", "json"):
        for item in _items(name)[:50]:
            assert len(tokenizer(item["prompt"])["input_ids"]) == item["prompt_tokens"]


def test_lengths_support_the_documented_truncation_limits() -> None:
    safe, tight = tasks.SAFE_MAX_INPUT_TOKENS, tasks.TIGHT_MAX_INPUT_TOKENS
    arith, recall, json_items = _items("arith"), _items("recall"), _items("json")
    # Some arith prompts are cut at the safe limit, but never into their last 8 characters.
    assert any(item["prompt_tokens"] > safe for item in arith)
    assert all(item["prompt"][-8:-1].replace("+", "").isdigit() for item in arith)
    assert max(item["prompt_tokens"] for item in recall + json_items) <= safe
    # At the tight limit every recall code (characters 5-8 after <bos>) is cut off.
    assert min(item["prompt_tokens"] for item in recall) - tight > 8
    assert max(item["prompt_tokens"] for item in json_items) <= tight


def test_json_references_satisfy_the_shipped_schema() -> None:
    validator = jsonschema.Draft202012Validator(json_output_schema())
    for item in _items("json"):
        validator.validate(json.loads(item["reference"]))
    assert not validator.is_valid({"sum": "870"}) and not validator.is_valid({"sum": "0870", "x": 1})


def test_load_suite_reads_zoo_suites_through_datasets() -> None:
    items = load_suite("arith", limit=5)
    assert len(items) == 5 and items[0]["id"] == "arith-test-0000"
    assert {"id", "prompt", "reference"} <= set(items[0])
    assert load_suite("zoo:recall", "calibration", limit=2)[0]["id"] == "recall-calibration-0000"
    assert len(load_suite("similarity")) == len(_items("similarity"))


def test_load_suite_reads_local_jsonl_csv_and_parquet(tmp_path: Path) -> None:
    rows = [{"id": "a", "prompt": "1+1=", "reference": "2"}, {"id": "b", "prompt": "2+2=", "reference": "4"}]
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    csv = tmp_path / "mine.csv"
    csv.write_text("id,prompt,reference\na,1+1=,2\nb,2+2=,4\n")
    import datasets

    parquet = tmp_path / "mine.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    for path in (jsonl, csv, parquet):
        loaded = load_suite(str(path))
        assert [r["prompt"] for r in loaded] == ["1+1=", "2+2="], path.suffix
        assert str(loaded[1]["reference"]) == "4"


def test_load_suite_errors_say_what_to_change(tmp_path: Path) -> None:
    with pytest.raises(ZooError, match="did you mean 'arith'"):
        suite_path("arit")
    with pytest.raises(ZooError, match="unknown zoo split"):
        suite_path("arith", "train")
    with pytest.raises(ZooError, match="does not exist"):
        load_suite(str(tmp_path / "absent.jsonl"))
    with pytest.raises(ZooError, match="neither a zoo suite"):
        load_suite("items.txt")
    lacking = tmp_path / "lacking.jsonl"
    lacking.write_text('{"id": "a", "question": "1+1="}\n')
    with pytest.raises(ZooError, match="lacks the field"):
        load_suite(str(lacking))
    assert SPLITS == ("test", "calibration")

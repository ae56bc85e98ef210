"""Each local evaluate module loads offline and gives known answers on hand-made inputs."""

from __future__ import annotations

import math
import re

import pytest

from servegate.zoo import METRICS, ZooError, json_output_schema, load_metric, metric_path


@pytest.mark.parametrize("name", METRICS)
def test_each_metric_is_a_folder_named_like_its_module_with_one_import_per_line(name: str) -> None:
    folder = metric_path(name)
    assert folder.name == name and (folder / f"{name}.py").is_file()
    for line in (folder / f"{name}.py").read_text().splitlines():
        # evaluate reads a module's dependencies from its import lines, one module a line.
        assert not re.match(r"^\s*import\s+\w+\s*,", line), line
        assert not re.match(r"^\s*from\s+\S+\s+import\s+.*,", line), line


def test_unknown_metric_suggests_the_closest() -> None:
    with pytest.raises(ZooError, match="did you mean 'exact_match'"):
        metric_path("exact-match")
    with pytest.raises(ZooError, match="invalid zoo metric name"):
        metric_path("../exact_match")


def test_exact_match() -> None:
    metric = load_metric("exact_match")
    assert metric.compute(predictions=["0870", "12", "QZKX"], references=["0870", "13", "QZKX"]) == {
        "exact_match": pytest.approx(2 / 3)
    }
    assert metric.compute(predictions=[" 7 "], references=["7"])["exact_match"] == 0.0
    assert metric.compute(predictions=[" 7 "], references=["7"], strip=True)["exact_match"] == 1.0


def test_json_schema_valid() -> None:
    metric = load_metric("json_schema_valid")
    outputs = ['{"sum":"0870"}', '{"sum":"870"}', "not json", '{"sum":"0001","extra":1}']
    result = metric.compute(predictions=outputs, schema=json_output_schema())
    assert result == {"json_schema_valid": 0.25, "json_parse_rate": 0.75}
    as_text = metric.compute(predictions=['{"a": 1}'], schema='{"type": "object", "required": ["a"]}')
    assert as_text["json_schema_valid"] == 1.0


def test_token_agreement() -> None:
    metric = load_metric("token_agreement")
    result = metric.compute(predictions=[[5, 6, 7], [1], [4, 4]], references=[[5, 6, 8], [1], [4]])
    # 2 of 3, 1 of 1, and 1 of 2 (the extra token disagrees): 4 of 6 positions.
    assert result == {
        "token_agreement": pytest.approx(4 / 6),
        "sequence_agreement": pytest.approx(1 / 3),
        "positions": 6,
    }


def test_mean_kl() -> None:
    metric = load_metric("mean_kl")
    same = metric.compute(predictions=[[1.0, 2.0, 3.0]], references=[[1.0, 2.0, 3.0]])
    assert same["mean_kl"] == pytest.approx(0.0, abs=1e-12)
    # Logits shifted by a constant are the same distribution; log-probs work as well as logits.
    shifted = metric.compute(predictions=[[11.0, 11.0]], references=[[math.log(0.5), math.log(0.5)]])
    assert shifted["mean_kl"] == pytest.approx(0.0, abs=1e-12)
    p, q = [0.75, 0.25], [0.5, 0.5]
    expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    result = metric.compute(
        predictions=[[math.log(v) for v in q], [0.0, 0.0]], references=[[math.log(v) for v in p], [0.0, 0.0]]
    )
    assert result["mean_kl"] == pytest.approx(expected / 2)
    assert result["max_kl"] == pytest.approx(expected) and result["positions"] == 2


def test_embedding_cosine() -> None:
    metric = load_metric("embedding_cosine")
    result = metric.compute(
        predictions=[[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]], references=[[2.0, 0.0], [1.0, 0.0], [-1.0, -1.0]]
    )
    assert result["mean_cosine"] == pytest.approx((1.0 + 0.0 - 1.0) / 3)
    assert result["min_cosine"] == pytest.approx(-1.0)


def test_pairwise_accuracy() -> None:
    metric = load_metric("pairwise_accuracy")
    result = metric.compute(predictions=[0.9, 0.4, 0.5, 0.7], references=[0.1, 0.6, 0.5, 0.2])
    # Ties are not wins: the similar pair must score strictly higher.
    assert result == {"pairwise_accuracy": 0.5}

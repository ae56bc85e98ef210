"""The documented truncation limits: the safe one costs nothing, the tight one loses recall."""

from __future__ import annotations

from zoo_helpers import load_causal, recorded_metrics

from servegate.zoo import SAFE_MAX_INPUT_TOKENS, TIGHT_MAX_INPUT_TOKENS, load_suite
from servegate.zoo.scoring import exact_match_rate, greedy_completions

SAMPLE = 100


def _score(suite: str, max_input_tokens: int | None, truncation: str = "left") -> float:
    model, tokenizer = load_causal("tiny-primary")
    items = load_suite(suite, limit=SAMPLE)
    outputs = greedy_completions(
        model, tokenizer, [i["prompt"] for i in items], max_input_tokens=max_input_tokens, truncation=truncation
    )
    return exact_match_rate(outputs, [i["reference"] for i in items])


def test_left_truncation_to_the_tight_limit_drops_recall_by_30_points() -> None:
    full = _score("recall", None)
    assert full - _score("recall", TIGHT_MAX_INPUT_TOKENS) >= 0.30


def test_left_truncation_to_the_safe_limit_loses_nothing() -> None:
    for suite in ("arith", "recall"):
        assert _score(suite, SAFE_MAX_INPUT_TOKENS) >= _score(suite, None) - 0.03, suite


def test_right_truncation_destroys_arith() -> None:
    assert _score("arith", TIGHT_MAX_INPUT_TOKENS, truncation="right") <= 0.5


def test_datasheet_records_the_two_limits() -> None:
    metrics = recorded_metrics("tiny-primary")
    assert metrics["limits"]["safe_max_input_tokens"] == SAFE_MAX_INPUT_TOKENS
    assert metrics["limits"]["tight_max_input_tokens"] == TIGHT_MAX_INPUT_TOKENS
    truncation = metrics["truncation_exact_match"]
    assert metrics["exact_match"]["none"]["recall"] - truncation[f"left@{TIGHT_MAX_INPUT_TOKENS}"]["recall"] >= 0.30

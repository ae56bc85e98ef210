"""The contract gate's penalty probe on the real reference engine (zoo:tiny-primary): logit_bias, presence_penalty
and frequency_penalty change greedy choices exactly as their formulas say on raw log-probabilities, and an engine
that ignores them (a planted fault) fails the gate; the formula judge itself is checked on hand-made answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.oracle_engine import reference_gate

from servegate.contracts.loading import load_manifest
from servegate.gates.probes.http_target import Answer
from servegate.gates.probes.penalty_probe import judge

MANIFEST = """\
apiVersion: servegate/v1
kind: ServedModel
name: penalised
weights: {source: zoo:tiny-primary}
preprocess: {chat_template: none, max_input_tokens: 64}
runtime:
  max_model_len: 128
  kv_cache: {block_size: 16, memory_budget: 4MiB}
batching: {mode: continuous, max_batch_size: 4, max_num_batched_tokens: 256}
postprocess: {max_output_tokens: 32, logprobs: true}
quality:
  suites:
    - {name: arith, dataset: zoo:arith, limit: 8, public: true}
"""


def answer(steps: list[tuple[int, dict[int, float]]]) -> Answer:
    tokens = tuple(f"token_id:{t}" for t, _ in steps)
    tops = tuple({f"token_id:{k}": v for k, v in top.items()} for _, top in steps)
    return Answer(False, 8, 200, "x", finish_reasons=("length",), logprob_tokens=tokens, top_logprobs=tops)


def test_the_judge_follows_the_formula_and_skips_near_ties() -> None:
    top = {1: -0.1, 2: -1.0, 3: -3.0}
    repeated = answer([(1, top), (2, top)])  # the second step: 1 is penalised by 1.5 and 2 wins
    assert judge(repeated, 1.5, 0.0, {}) == type(judge(repeated, 1.5, 0.0, {}))(2, 1, None)
    ignored = answer([(1, top), (1, top)])
    found = judge(ignored, 1.5, 0.0, {})
    assert found is not None and found.broken == "step 2 chose token 1, the formula's choice is 2"
    tie = answer([(1, {1: -0.5, 2: -0.52, 3: -4.0})])
    assert judge(tie, 0.0, 0.0, {}).judged == 0  # type: ignore[union-attr]
    assert judge(answer([(2, top)]), 0.0, 0.0, {2: 1.9}).changed == 1  # type: ignore[union-attr]
    named_by_text = Answer(False, 8, 200, "x", logprob_tokens=("a",), top_logprobs=({"a": -0.1},))
    assert judge(named_by_text, 0.0, 0.0, {}) is None


def contract(tmp_path: Path) -> Any:
    (tmp_path / "m.yaml").write_text(MANIFEST)
    served = load_manifest(tmp_path / "m.yaml")
    return reference_gate(served, tmp_path / "cache")


def test_penalties_and_bias_follow_their_formulas_on_the_reference_engine(tmp_path: Path) -> None:
    result = contract(tmp_path)
    assert result.verdict in ("pass", "warn"), result.reason
    checked = result.measurements.checked["presence_penalty, frequency_penalty, logit_bias"]
    assert checked.startswith("measured: all ") and "follow the formula" in checked


def test_an_engine_that_ignores_penalties_fails_the_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servegate.runtime.model.logit_processors as processors

    monkeypatch.setattr(processors, "reshape_logits", lambda logits, params, histories: logits)
    result = contract(tmp_path)
    assert result.verdict == "fail" and "is not applied as its formula says" in result.reason, result.reason

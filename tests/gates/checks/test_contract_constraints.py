"""The contract gate probes every output-constraint kind the manifest serves, alone and under load, on the real
reference engine (zoo:tiny-primary): the safe engine passes with every ended answer satisfying its constraint,
and a mask that lets illegal tokens through fails the gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.oracle_engine import reference_gate

from servegate.contracts.loading import load_manifest

pytest.importorskip("llguidance")

MANIFEST = """\
apiVersion: servegate/v1
kind: ServedModel
name: constrained
weights: {source: zoo:tiny-primary}
preprocess: {chat_template: none, max_input_tokens: 64}
runtime:
  max_model_len: 128
  kv_cache: {block_size: 16, memory_budget: 4MiB}
batching: {mode: continuous, max_batch_size: 4, max_num_batched_tokens: 256}
postprocess:
  max_output_tokens: 32
  structured_output: {whitespace: compact}
quality:
  suites:
    - {name: arith, dataset: zoo:arith, limit: 8, public: true}
"""


def contract(tmp_path: Path) -> Any:
    (tmp_path / "m.yaml").write_text(MANIFEST)
    served = load_manifest(tmp_path / "m.yaml")
    return reference_gate(served, tmp_path / "cache")


def test_every_served_kind_holds_alone_and_under_load(tmp_path: Path) -> None:
    result = contract(tmp_path)
    assert result.verdict in ("pass", "warn"), result.reason
    measured = result.measurements.constraints_under_load
    kinds = {p.probe for p in measured.phases}
    assert kinds == {"json_object", "json_schema", "regex", "choice", "grammar"}
    assert {(p.concurrency, p.stream) for p in measured.phases} == {(1, False), (1, True), (4, False), (4, True)}
    assert sum(p.broken for p in measured.phases) == 0 and measured.first_broken is None
    assert all(p.ended > 0 for p in measured.phases if p.probe in ("regex", "choice", "grammar"))
    checked = result.measurements.checked["postprocess.structured_output"]
    assert checked.startswith("measured: all ") and "satisfy their constraint" in checked


def test_a_mask_that_lets_illegal_tokens_through_fails_the_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servegate.runtime.model.grammar_mask import GrammarMask

    real = GrammarMask.allowed
    calls = {"n": 0}

    def leaky(self: GrammarMask, matchers: Any, width: int) -> torch.Tensor:
        allowed = real(self, matchers, width)
        calls["n"] += 1
        return torch.ones_like(allowed) if calls["n"] % 3 == 0 else allowed  # every third step unmasked

    monkeypatch.setattr(GrammarMask, "allowed", leaky)
    result = contract(tmp_path)
    assert result.verdict == "fail" and "break their output constraint" in result.reason, result.reason
    assert sum(p.broken for p in result.measurements.constraints_under_load.phases) > 0

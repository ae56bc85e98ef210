"""The contract gate probes every forced tool_choice mode the manifest serves, alone and under load, on the real
reference engine (zoo:tiny-primary behind a short tools template): the safe server passes with every call
parsing, and a parser that drops the last argument fails the gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.oracle_engine import reference_gate
from support.tool_faults import drops_last_argument

from servegate.contracts.loading import load_manifest

pytest.importorskip("llguidance")

TEMPLATE = (
    "{%- if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
)
MANIFEST = """\
apiVersion: servegate/v1
kind: ServedModel
name: tooled
weights: {source: zoo:tiny-primary}
preprocess: {chat_template: tools.jinja, max_input_tokens: 96}
runtime:
  max_model_len: 192
  kv_cache: {block_size: 16, memory_budget: 4MiB}
batching: {mode: continuous, max_batch_size: 4, max_num_batched_tokens: 256}
postprocess:
  max_output_tokens: 64
  structured_output: {whitespace: compact}
  tools: {}
quality:
  suites:
    - {name: arith, dataset: zoo:arith, limit: 8, public: true}
"""


def contract(tmp_path: Path) -> Any:
    (tmp_path / "tools.jinja").write_text(TEMPLATE)
    (tmp_path / "m.yaml").write_text(MANIFEST)
    served = load_manifest(tmp_path / "m.yaml")
    return reference_gate(served, tmp_path / "cache")


def test_every_forced_mode_parses_alone_and_under_load(tmp_path: Path) -> None:
    result = contract(tmp_path)
    assert result.verdict in ("pass", "warn"), result.reason
    measured = result.measurements.tools_under_load
    assert {p.probe for p in measured.phases} == {"required", "named"}
    assert {(p.concurrency, p.stream) for p in measured.phases} == {(1, False), (1, True), (4, False), (4, True)}
    assert sum(p.broken for p in measured.phases) == 0 and measured.first_broken is None
    assert all(p.ended > 0 for p in measured.phases)
    checked = result.measurements.checked["postprocess.tools"]
    assert checked.startswith("measured: all ") and "carry calls that parse and satisfy their schema" in checked


def test_a_parser_that_drops_the_last_argument_fails_the_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servegate.server.bodies as bodies

    monkeypatch.setattr(bodies, "read_tool_calls", drops_last_argument(bodies.read_tool_calls))
    result = contract(tmp_path)
    assert result.verdict == "fail" and "carry a tool call that does not parse" in result.reason, result.reason
    assert "'b' is a required property" in (result.measurements.tools_under_load.first_broken or "")

"""The chat suite kinds on a real instruct model (SmolLM2-135M-Instruct behind examples/tools/chatml-tools.jinja;
`make fetch`, skipped when it is not fetched): `gate eval` scores the zoo's extraction and tools suites, a parser
that drops the last argument fails the tools suite's paired test and its safe twin passes; and manifests or items
the chat kinds cannot run are refused before anything is generated, naming the suite or item."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.manifests import real_manifest, write_manifest
from support.tool_faults import drops_last_argument

import servegate.gates.suites.chat_items as chat_items
from servegate.cli.app import main
from servegate.contracts.errors import ManifestError, ServegateError
from servegate.contracts.loading import load_manifest
from servegate.gates.quality.comparison import QualityComparison, compare_runs
from servegate.gates.suites.evaluation import ItemOutput, SuiteRun, load_suite_data, score_run
from servegate.zoo import ZooError, zoo_model_path

pytest.importorskip("llguidance")
NAME = "smollm2-135m-instruct"
TEMPLATE = Path(__file__).resolve().parents[3] / "examples" / "tools" / "chatml-tools.jinja"
SUITES = [
    {"name": "extraction", "dataset": "zoo:extraction", "kind": "extraction", "limit": 8, "max_tokens": 64,
     "public": True},
    {"name": "tools", "dataset": "zoo:tools", "kind": "tools", "limit": 6, "max_tokens": 64, "public": True},
]  # fmt: skip
PAIRED_TOOLS = {**SUITES[1], "limit": 16}
"""The tools suite the paired tests run on: 16 items detect a 0.25 margin (8 would only warn)."""


def chat_manifest(weights: str = f"zoo:{NAME}", **post: Any) -> dict[str, Any]:
    manifest = real_manifest(
        weights,
        preprocess={"chat_template": str(TEMPLATE), "max_input_tokens": 512, "max_payload_bytes": 16384},
        runtime={"max_model_len": 640, "threads": 2, "kv_cache": {"block_size": 16, "memory_budget": "64MiB"}},
        batching={"max_num_batched_tokens": 640},
        postprocess={"max_output_tokens": 64, "structured_output": {"whitespace": "compact"}, "tools": {}, **post},
    )
    manifest["name"] = "smol"
    # 16 tool items take about 27 s at batch 8 on a quiet 2-core machine: the deadline is not what these tests
    # check, so it is generous enough for a busy one (at 30 s every item ended deadline_exceeded under load)
    manifest["failure_policy"]["request_timeout_s"] = 300
    manifest["quality"] = {"suites": SUITES, "default_margin": 0.25}
    return manifest


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        zoo_model_path(NAME)
    except ZooError:
        pytest.skip(f"zoo:{NAME} is not fetched: run `make fetch`")
    return write_manifest(tmp_path_factory.mktemp("chat_suites"), chat_manifest())


def gate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["gate", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_gate_eval_scores_extraction_and_tool_calls(
    smol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "eval.json"
    monkeypatch.setenv("SERVEGATE_CACHE", str(tmp_path / "cache"))
    code, err = gate(monkeypatch, capsys, "eval", str(smol), "--json", str(report))
    assert code == 0, err
    suites = json.loads(report.read_text())["suites"]
    extraction, tools = suites["extraction"]["metrics"], suites["tools"]["metrics"]
    assert set(extraction) == {"json_schema_valid", "field_accuracy"}
    assert set(tools) == {"tool_name_match", "tool_arguments_match"}
    assert extraction["json_schema_valid"]["score"] == 1.0  # decoded under its schema, every answer is valid
    assert 0.2 < extraction["field_accuracy"]["score"] < 1.0  # measured 0.5 on 12 items: a real, imperfect model
    assert tools["tool_name_match"]["score"] > 0 and 0 <= tools["tool_arguments_match"]["score"] <= 1


def faithful_answer(reference: str) -> str:
    """The answer a model that gets the item right writes under tool_choice required: the expected calls as a
    JSON list of {"name", "parameters"}."""
    expected = json.loads(reference)
    calls = expected if isinstance(expected, list) else [expected]
    return json.dumps([{"name": call["name"], "parameters": call["arguments"]} for call in calls])


def test_a_parser_that_drops_the_last_argument_fails_the_tools_suite(
    smol: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The answers are the items' own references rather than SmolLM2's: how many calls a 135M model gets right
    # depends on the CPU's kernels (0 of 16 on one AMD EPYC kind, some on another), and what this test checks is
    # the parser through the paired test, which needs answers whose arguments are right.
    served = load_manifest(smol).with_changes(quality={"suites": [PAIRED_TOOLS], "default_margin": 0.25})
    data = load_suite_data(served, served.quality.suites[0])
    outputs = [ItemOutput(item.id, faithful_answer(item.reference), finish_reason="stop") for item in data.items]
    run = SuiteRun(data, outputs, score_run(data, outputs))
    assert all(score == 1.0 for score in run.scores["tool_arguments_match"]), run.scores

    def compared(candidate: SuiteRun) -> QualityComparison:
        out = QualityComparison()
        compare_runs(served, data, run, candidate, out)
        return out

    safe = compared(SuiteRun(data, run.outputs, score_run(data, run.outputs)))
    assert safe.verdict == "pass", safe.reason()
    monkeypatch.setattr(chat_items, "read_tool_calls", drops_last_argument(chat_items.read_tool_calls))
    faulty = compared(SuiteRun(data, run.outputs, score_run(data, run.outputs)))
    assert faulty.verdict == "fail" and faulty.reason().startswith("tools/tool_arguments_match"), faulty.reason()


def test_manifests_the_chat_kinds_cannot_run_are_refused(tmp_path: Path) -> None:
    plain = chat_manifest("zoo:tiny-primary", tools={"tool_choice": ["auto"]})
    plain["postprocess"].pop("structured_output")
    with pytest.raises(ManifestError, match=r"quality.suites\[extraction\] \(kind: extraction\) decodes under each "):
        load_manifest(write_manifest(tmp_path, plain))
    untemplated = chat_manifest("zoo:tiny-primary")
    untemplated["preprocess"]["chat_template"] = "none"
    untemplated["postprocess"].pop("tools")
    untemplated["quality"]["suites"] = SUITES[:1]
    with pytest.raises(ManifestError, match=r"sends chat requests: it needs preprocess.chat_template"):
        load_manifest(write_manifest(tmp_path, untemplated))
    misplaced = chat_manifest("zoo:tiny-primary")
    misplaced["quality"]["suites"] = [{**SUITES[0], "metrics": ["tool_name_match"]}]
    with pytest.raises(ManifestError, match="tool_name_match score tool calls: they need kind: tools"):
        load_manifest(write_manifest(tmp_path, misplaced))


def test_items_the_manifest_refuses_are_named_when_the_suite_loads(tmp_path: Path) -> None:
    auto_only = load_manifest(
        write_manifest(tmp_path, chat_manifest("zoo:tiny-primary", tools={"tool_choice": ["auto"]}))
    )
    with pytest.raises(ServegateError, match=r"item tools-test-0000: the manifest refuses it \(tool_choice: "):
        load_suite_data(auto_only, auto_only.quality.suites[1])
    rows = tmp_path / "bad.jsonl"
    rows.write_text(json.dumps({"id": "a", "prompt": "p", "reference": "{}", "tools": "[{oops"}) + "\n")
    bad = chat_manifest("zoo:tiny-primary")
    bad["quality"]["suites"] = [{"name": "mine", "dataset": str(rows), "kind": "tools"}]
    served = load_manifest(write_manifest(tmp_path, bad))
    with pytest.raises(ServegateError, match=r"quality.suites\[mine\] item a: `tools` is not JSON"):
        load_suite_data(served, served.quality.suites[0])
    rows.write_text(json.dumps({"id": "b", "prompt": "p", "reference": "{}"}) + "\n")
    bad["quality"]["suites"] = [{"name": "mine", "dataset": str(rows), "kind": "extraction"}]
    served = load_manifest(write_manifest(tmp_path, bad))
    with pytest.raises(ServegateError, match=r"item b: an extraction item needs a `schema`"):
        load_suite_data(served, served.quality.suites[0])

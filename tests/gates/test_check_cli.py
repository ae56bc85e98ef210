"""`gate check` and `gate eval` from the command line: exit codes, reports (JSON, JUnit, Markdown), the cache."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.cli import GateRun, in_process_gate


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> GateRun:
    """Run the real entry point in process on fake engines; returns (exit code, stdout, stderr)."""
    return in_process_gate(monkeypatch, tmp_path, capsys)


def test_a_safe_change_exits_0_with_a_json_report(gate, manifests: Path, tmp_path: Path) -> None:  # noqa: ANN001
    report = tmp_path / "report.json"
    code, out, _ = gate("check", "--baseline", str(manifests / "base.yaml"), "--candidate",
                        str(manifests / "base.yaml"), "--set", "runtime.quantization.method=int8-dynamic",
                        "--json", str(report))  # fmt: skip
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass" and len(data["fingerprint"]) == 64
    gates = {g["name"]: g for g in data["gates"]}
    assert gates["quantization"]["verdict"] == "pass"
    assert gates["quantization"]["triggered_by"] == ["changed: runtime.quantization.method"]
    assert gates["truncation"]["verdict"] == "skipped" and "no watched field changed" in gates["truncation"]["reason"]
    for g in data["gates"]:
        assert set(g) >= {"name", "verdict", "reason", "measurements"}
    assert "quantization" in out and "PASS" in out


def test_a_failing_gate_exits_1_and_junit_names_it(gate, manifests: Path, tmp_path: Path) -> None:  # noqa: ANN001
    junit, md = tmp_path / "gates.xml", tmp_path / "gates.md"
    base, int2 = str(manifests / "base.yaml"), str(manifests / "int2.yaml")
    code, out, _ = gate("check", "--baseline", base, "--candidate", int2, "--junit", str(junit), "--markdown", str(md))
    assert code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and int(suite.get("failures", "-1")) == 1
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) >= {"contract", "quantization", "truncation", "caching", "batching", "fallback", "quality"}
    failure = cases["quantization"].find("failure")
    assert failure is not None and "inferior" in failure.get("message", "")
    assert cases["truncation"].find("skipped") is not None
    assert cases["truncation"].find("failure") is None
    text = md.read_text()
    assert "**FAIL**" in text and "| quantization | fail |" in text
    assert "FAIL" in out


def test_single_manifest_runs_against_its_reference_form(gate, manifests: Path, tmp_path: Path) -> None:  # noqa: ANN001
    report = tmp_path / "r.json"
    code, _, _ = gate("check", str(manifests / "tight.yaml"), "--gate", "truncation", "--gate", "quantization",
                      "--json", str(report))  # fmt: skip
    data = json.loads(report.read_text())
    assert code == 1
    assert data["mode"] == "reference" and data["baseline"]["form"] == "reference form"
    verdicts = {g["name"]: g["verdict"] for g in data["gates"] if g["name"] != "capacity"}
    assert verdicts == {"contract": "skipped", "quantization": "pass", "truncation": "fail", "caching": "skipped",
                        "batching": "skipped", "load": "skipped", "fallback": "skipped",
                        "quality": "skipped"}  # fmt: skip


def test_warnings_pass_unless_strict(gate, manifests: Path) -> None:  # noqa: ANN001
    small = [
        "--set",
        "quality.suites.0.limit=20",
        "--set",
        "quality.suites.1.limit=20",
        "--set",
        "quality.suites.2.limit=20",
    ]
    args = ["check", str(manifests / "base.yaml"), "--gate", "quantization", *small]
    code, out, _ = gate(*args)
    assert code == 0 and "too small" in out
    strict, _, _ = gate(*args, "--strict")
    assert strict == 1


def test_json_to_stdout_keeps_stdout_machine_readable(gate, manifests: Path) -> None:  # noqa: ANN001
    code, out, err = gate("check", str(manifests / "base.yaml"), "--gate", "caching", "--json", "-")
    assert code == 0
    assert json.loads(out)["gates"][3]["name"] == "caching"
    assert "caching" in err


def test_the_baseline_cache_is_reused(gate, manifests: Path, tmp_path: Path) -> None:  # noqa: ANN001
    first, second = tmp_path / "1.json", tmp_path / "2.json"
    gate("check", str(manifests / "base.yaml"), "--gate", "quantization", "--json", str(first))
    gate("check", str(manifests / "int2.yaml"), "--gate", "quantization", "--json", str(second))
    first_q = json.loads(first.read_text())["gates"][1]["measurements"]["suites"]["arith"]
    second_data = json.loads(second.read_text())
    assert first_q["baseline_from_cache"] is False
    assert second_data["gates"][1]["measurements"]["suites"]["arith"]["baseline_from_cache"] is True
    assert any("3 hit(s)" in note for note in second_data["notes"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check"], "give a MANIFEST, or both --baseline A and --candidate B"),
        (["check", "x.yaml", "--baseline", "y.yaml"], "not both"),
        (["check", "{m}/base.yaml", "--gate", "quantisation"], "did you mean 'quantization'?"),
        (["check", "{m}/missing.yaml"], "file not found"),
        (["check", "{m}/base.yaml", "--set", "batching.max_batch_size=0"], "must be >= 1"),
        (["eval", "{m}/base.yaml", "--suite", "recal"], "did you mean 'recall'?"),
    ],
)
def test_usage_and_manifest_errors_exit_2(gate, manifests: Path, args: list[str], message: str) -> None:  # noqa: ANN001
    code, _, err = gate(*(a.replace("{m}", str(manifests)) for a in args))
    assert code == 2
    assert message in err and err.startswith("error: ")


def test_list_shows_every_gate_with_what_it_watches(gate) -> None:  # noqa: ANN001
    code, out, _ = gate("check", "--list", "--json", "-")
    names = [g["name"] for g in json.loads(out)["gates"]]
    assert code == 0
    assert names[:8] == ["contract", "quantization", "truncation", "caching", "batching", "load", "fallback",
                         "quality"]  # fmt: skip
    alone = [g["name"] for g in json.loads(out)["gates"] if g["with_jobs"] == "alone"]
    assert alone == ["caching", "capacity"]  # the gates that time something run alone under --jobs


def test_eval_reports_each_metric_with_its_interval(gate, manifests: Path) -> None:  # noqa: ANN001
    code, out, err = gate("eval", str(manifests / "base.yaml"), "--suite", "json", "--json", "-")
    assert code == 0
    data = json.loads(out)
    assert list(data["suites"]) == ["json"]
    metrics = data["suites"]["json"]["metrics"]
    assert metrics["exact_match"]["n"] == 80 and metrics["exact_match"]["score"] == 1.0
    assert metrics["exact_match"]["low"] == pytest.approx(0.025 ** (1 / 80), abs=1e-6)  # Clopper-Pearson, 0 misses
    assert metrics["json_schema_valid"]["method"] == "Clopper-Pearson"
    assert "json_schema_valid" in err


def test_console_script_exits_2_on_a_bad_manifest(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nweights: {source: zoo:tiny-primary}\nbatching: {max_batch_sise: 2}\n")
    result = subprocess.run([sys.executable, "-m", "servegate.cli", "check", str(bad)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 2
    assert "did you mean 'max_batch_size'?" in result.stderr

"""`gate validate / schema / fingerprint / diff` from the command line: output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "examples/quickstart/manifest.yaml"


def gate(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "servegate.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=120,
    )


def test_validate_ok_explains_the_six_elements() -> None:
    result = gate("validate", str(QUICKSTART))
    assert result.returncode == 0, result.stderr
    for element in ("weights", "preprocess", "runtime", "batching", "postprocess", "failure_policy"):
        assert element in result.stdout
    assert "fingerprint" in result.stdout


def test_validate_error_is_one_located_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nweights: {source: zoo:tiny-primary}\nbatching:\n  max_batch_size: 0\n")
    result = gate("validate", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: bad.yaml:4:3: batching.max_batch_size: must be >= 1 (got 0)"
    assert "Traceback" not in result.stderr


def test_validate_says_which_output_constraints_are_served_and_refuses_one_with_nothing_to_enforce(
    tmp_path: Path,
) -> None:
    served = tmp_path / "constrained.yaml"
    served.write_text(
        "name: x\nweights: {source: zoo:tiny-primary}\npostprocess:\n"
        "  structured_output: {kinds: [json_schema, choice], max_spec_bytes: 4096, whitespace: compact}\n"
    )
    result = gate("validate", str(served), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "output constraints from requests: json_schema, choice up to 4096 bytes" in result.stdout
    assert "llguidance mask, JSON whitespace compact" in result.stdout
    served.write_text("name: x\nweights: {source: zoo:tiny-primary}\npostprocess:\n"
                      "  structured_output: {request_constraints: false}\n")  # fmt: skip
    refused = gate("validate", str(served), cwd=tmp_path)
    assert refused.returncode == 2 and "needs enforce_output_schema: true" in refused.stderr


def test_validate_names_the_tool_calling_served_and_refuses_forced_calls_without_a_grammar_engine(
    tmp_path: Path,
) -> None:
    served = tmp_path / "tools.yaml"
    served.write_text(
        "name: x\nweights: {source: zoo:tiny-primary}\npreprocess: {chat_template: tokenizer}\npostprocess:\n"
        "  structured_output: {}\n  tools: {tool_choice: [auto, required]}\n"
    )
    result = gate("validate", str(served), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tool calls: tool_choice auto, required, read by the hermes parser" in result.stdout
    served.write_text("name: x\nweights: {source: zoo:tiny-primary}\npostprocess:\n  tools: {}\n")
    refused = gate("validate", str(served), cwd=tmp_path)
    assert refused.returncode == 2 and "declare postprocess.structured_output" in refused.stderr


def test_debug_variable_shows_the_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    result = gate("validate", str(bad), cwd=tmp_path, env={"SERVEGATE_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_validate_set_and_json_to_stdout() -> None:
    result = gate("validate", str(QUICKSTART), "--set", "batching.max_batch_size=4", "--json", "-")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["valid"] is True and len(payload["fingerprint"]) == 64
    assert "fingerprint" in result.stderr  # the human table moved to stderr


def test_bad_set_is_a_usage_error() -> None:
    result = gate("validate", str(QUICKSTART), "--set", "batching.max_batch_size")
    assert result.returncode == 2
    assert "expected PATH=VALUE" in result.stderr


def test_unknown_command_and_missing_file_exit_2(tmp_path: Path) -> None:
    assert gate("frobnicate").returncode == 2
    result = gate("validate", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert result.returncode == 2 and "nope.yaml: file not found" in result.stderr


def test_schema_is_json_on_stdout(tmp_path: Path) -> None:
    result = gate("schema")
    assert result.returncode == 0
    assert json.loads(result.stdout)["title"] == "servegate ServedModel manifest"
    out = tmp_path / "schema.json"
    assert gate("schema", "-o", str(out)).returncode == 0
    assert json.loads(out.read_text())["properties"]["weights"]


def test_fingerprint_matches_json(tmp_path: Path) -> None:
    plain = gate("fingerprint", str(QUICKSTART)).stdout.strip()
    out = tmp_path / "fp.json"
    assert gate("fingerprint", str(QUICKSTART), "--json", str(out)).returncode == 0
    assert json.loads(out.read_text())["fingerprint"] == plain and len(plain) == 64


@pytest.mark.parametrize("exit_code", [False, True])
def test_diff_shows_changes_and_gates(tmp_path: Path, exit_code: bool) -> None:
    args = [
        "diff",
        str(QUICKSTART),
        str(QUICKSTART),
        "--set",
        "runtime.quantization.method=int2-weight",
        "--json",
        str(tmp_path / "d.json"),
    ]
    result = gate(*args, *(["--exit-code"] if exit_code else []))
    assert result.returncode == (1 if exit_code else 0), result.stderr
    assert "runtime.quantization.method" in result.stdout
    assert '"int8-weight"' in result.stdout and '"int2-weight"' in result.stdout
    assert "quantization" in result.stdout
    report = json.loads((tmp_path / "d.json").read_text())
    # what `gate check` runs for it: the quantization gate, and the capacity gate (int2 changes the speed)
    assert report["gates"] == {gate: ["runtime.quantization.method"] for gate in ("quantization", "capacity")}


def test_diff_of_identical_manifests() -> None:
    result = gate("diff", str(QUICKSTART), str(QUICKSTART), "--exit-code")
    assert result.returncode == 0
    assert "no differences" in result.stdout


def test_version() -> None:
    result = gate("--version")
    assert result.returncode == 0 and result.stdout.startswith("servegate ")

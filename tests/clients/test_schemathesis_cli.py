"""The schemathesis command line over the document `gate serve` publishes at /openapi.json, as a user runs it.

Every default check but positive-data acceptance (a schema-valid prompt can still be longer than
max_input_tokens: a documented 400 that JSON Schema cannot state); examples, coverage, fuzzing and stateful
phases (the 202 of Prefer: respond-async links to its polling operation).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from clients_harness import GateServe

pytestmark = pytest.mark.clients


def test_schemathesis_run_passes_over_the_published_document(gate_serve: GateServe, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).with_name("schemathesis")  # servegate's test extra installs it
    command = [str(schemathesis), "run", f"{gate_serve.base_url}/openapi.json", "--max-examples", "30"]
    command += ["--exclude-checks", "positive_data_acceptance", "--seed", "1"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:]
    summary = run.stdout.split("SUMMARY")[-1]
    assert "No issues found" in summary and "✅ Stateful" in summary  # 202 -> its polling link was followed

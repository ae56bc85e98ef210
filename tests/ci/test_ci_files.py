"""The shipped CI files pass their ecosystem's linter: actionlint for the GitHub workflow, GitLab's CI schema (as
check-jsonschema vendors it) for the GitLab file; both offline. A broken copy fails, so the check can fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CI = Path(__file__).parents[2] / "examples" / "ci"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    found = BIN / name if (BIN / name).is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return str(found)


def _actionlint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("actionlint"), "-no-color", str(path)], capture_output=True, text=True, timeout=120)


def _gitlab_schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci", str(path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_github_workflow_passes_actionlint(tmp_path: Path) -> None:
    done = _actionlint(CI / "github-workflow.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"  # a step output that no step writes, and an unknown key
    text = (CI / "github-workflow.yml").read_text()
    broken.write_text(text.replace("steps.key.outputs.key }}", "steps.nokey.outputs.key }}", 1)
                      .replace("timeout-minutes: 60", "timeout-minute: 60"))  # fmt: skip
    done = _actionlint(broken)
    assert done.returncode == 1 and "nokey" in done.stdout and "timeout-minute" in done.stdout


def test_the_gitlab_file_passes_gitlab_s_schema(tmp_path: Path) -> None:
    done = _gitlab_schema(CI / "gitlab-ci.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text((CI / "gitlab-ci.yml").read_text().replace("  script:\n", "  scripts:\n"))
    done = _gitlab_schema(broken)
    assert done.returncode == 1 and "scripts" in done.stdout


def test_both_ci_files_run_the_same_gate_steps() -> None:
    for name in ("github-workflow.yml", "gitlab-ci.yml"):
        text = (CI / name).read_text()
        assert "bash examples/ci/run-steps.sh check" in text, name
        assert "gate-out" in text and ".servegate-cache" in text, name

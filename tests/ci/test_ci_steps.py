"""The CI files' gate steps (examples/ci/run-steps.sh), run as CI runs them in a temporary repository whose main
holds the quickstart manifest unquantized, and two branches: int8 weights (safe) and int2 weights (unsafe: far
fewer answers survive). Real `gate`, real tiny models, no network."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
STEPS = ROOT / "examples" / "ci" / "run-steps.sh"


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """main: the quickstart manifest (quantization none) and its fallback; `safe` (int8) and `unsafe` (int2) branch
    off it, one commit each."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    for name in ("manifest.yaml", "fallback.yaml"):
        shutil.copy(ROOT / "examples" / "quickstart" / name, root / name)
    quickstart = (root / "manifest.yaml").read_text()
    quantized = re.search(r"    method: int8-weight[^\n]*\n    calibration: zoo:arith\n", quickstart)
    assert quantized is not None
    (root / "manifest.yaml").write_text(quickstart.replace(quantized.group(0), "    method: none\n"))
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "quickstart")
    manifest = (root / "manifest.yaml").read_text()
    for branch, method in (("safe", "int8-weight"), ("unsafe", "int2-weight")):
        old, new = "    method: none\n", f"    method: {method}\n    calibration: zoo:arith\n"
        assert old in manifest
        _git(root, "checkout", "-q", "-b", branch, "main")
        (root / "manifest.yaml").write_text(manifest.replace(old, new))
        _git(root, "commit", "-q", "-am", branch)
    return root


def _steps(repo: Path, tmp_path: Path, step: str, out: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MANIFEST": "manifest.yaml", "BASE_REV": "main", "GATE_OUT": str(tmp_path / out),
           "SERVEGATE_CACHE": str(tmp_path / "cache"), "GITHUB_STEP_SUMMARY": str(tmp_path / "step-summary.md"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    return subprocess.run(["bash", str(STEPS), step], cwd=repo, capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip


def _junit(path: Path) -> dict[str, str]:
    """testcase name -> failure, skipped or pass."""
    cases = ET.parse(path).getroot().iter("testcase")
    return {c.get("name", ""): next((child.tag for child in c if child.tag in ("failure", "skipped")), "pass")
            for c in cases}  # fmt: skip


@pytest.mark.slow  # 148 s on the busy 2-core VM: three `gate` processes, two checks on the real tiny models
def test_the_workflow_steps_pass_a_safe_change_and_block_an_unsafe_one(repo: Path, tmp_path: Path) -> None:
    key = _steps(repo, tmp_path, "key", "unused")
    assert key.returncode == 0, key.stderr
    assert re.fullmatch(r"servegate-baseline-[0-9a-f]{40}\n", key.stdout)

    # a cache left by another baseline: emptied, never read
    (tmp_path / "cache" / "outputs").mkdir(parents=True)
    (tmp_path / "cache" / "KEY").write_text("servegate-baseline-old\n")
    (tmp_path / "cache" / "outputs" / "old-entry.json").write_text("{}")

    _git(repo, "checkout", "-q", "safe")
    safe = _steps(repo, tmp_path, "check", "safe")
    assert safe.returncode == 0, safe.stdout + safe.stderr
    assert "was kept for another baseline: emptied" in safe.stdout
    assert not (tmp_path / "cache" / "outputs" / "old-entry.json").exists()
    assert (tmp_path / "cache" / "KEY").read_text() == key.stdout
    assert (tmp_path / "safe" / "exit-code").read_text() == "0\n"
    cases = _junit(tmp_path / "safe" / "gates.xml")
    assert cases["quantization"] == "pass" and "failure" not in cases.values()
    summary = (tmp_path / "safe" / "summary.md").read_text()
    assert "### gate check: quickstart 1.0.0: **PASS**" in summary
    changed = r'\| runtime\.quantization\.method \| `"none"` \| `"int8-weight"` \| quantization'
    assert re.search(changed, summary), summary
    assert f"Full report: `{tmp_path / 'safe' / 'report.json'}`." in summary

    _git(repo, "checkout", "-q", "unsafe")
    unsafe = _steps(repo, tmp_path, "check", "unsafe")
    assert unsafe.returncode == 1, unsafe.stdout + unsafe.stderr
    assert (tmp_path / "unsafe" / "exit-code").read_text() == "1\n"
    assert _junit(tmp_path / "unsafe" / "gates.xml")["quantization"] == "failure"
    summary = (tmp_path / "unsafe" / "summary.md").read_text()
    assert "### gate check: quickstart 1.0.0: **FAIL**" in summary
    assert re.search(r"\d+ of \d+ gate\(s\) run failed: quantization", summary), summary
    row = r"\| quantization \| \*\*FAIL\*\* \| [a-z_]+/[a-z_]+ Δ -\d\.\d{3} \(margin -\d\.\d{3}\) \| \["
    assert re.search(row, summary), summary
    assert "<details><summary>quantization: fail</summary>" in summary
    assert "Baseline: manifest.yaml read from git main" in summary
    # both summaries went to the job's summary page, in order
    page = (tmp_path / "step-summary.md").read_text()
    assert page.index("**PASS**") < page.index("**FAIL**")

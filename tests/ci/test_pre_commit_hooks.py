"""The shipped `.pre-commit-hooks.yaml`, run by pre-commit itself (`pre-commit try-repo`) in a temporary repository.
No network: the hooks are `language: system`, so pre-commit installs nothing and runs this environment's `gate`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servegate.contracts.loading import load_manifest

ROOT = Path(__file__).parents[2]
MANIFEST = """\
apiVersion: servegate/v1
kind: ServedModel
name: hooked
version: 1.0.0
weights: {source: zoo:tiny-primary}
preprocess: {max_input_tokens: 64}
runtime: {max_model_len: 128}
postprocess: {max_output_tokens: 16}
"""
GITLAB_CI = "include:\n  - template: Security/SAST.gitlab-ci.yml\nstages: [test]\n"
"""A YAML file with an `include:` that is not a manifest's: the validate hook must skip it."""
HOOKS = (
    "servegate manifests are valid",
    "servegate serving notes are current",
    "servegate committed fingerprints match",
)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env).stdout


def _try_repo(project: Path, hooks: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`pre-commit try-repo HOOKS ARGS...` in the project, with `gate` of this environment on PATH."""
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "PRE_COMMIT_COLOR": "never",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(hooks), *args], cwd=project,
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


def _outcomes(stdout: str) -> dict[str, str]:
    """Hook name -> Passed, Failed or Skipped, from pre-commit's summary lines."""
    return {name: line.rsplit(".", 1)[-1].split()[0] for line in stdout.splitlines() for name in HOOKS
            if line.startswith(name + ".")}  # fmt: skip


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path]:
    """A repository holding only the shipped hooks file, and a project with a manifest, its committed fingerprint,
    a serving note of it, and a GitLab CI file."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    _git(hooks, "init", "-q")
    shutil.copy(ROOT / ".pre-commit-hooks.yaml", hooks / ".pre-commit-hooks.yaml")
    _git(hooks, "add", "-A")
    _git(hooks, "commit", "-q", "-m", "hooks")

    project = tmp_path / "project"
    project.mkdir()
    _git(project, "init", "-q")
    (project / "m.yaml").write_text(MANIFEST)
    (project / ".gitlab-ci.yml").write_text(GITLAB_CI)
    fingerprint = load_manifest(project / "m.yaml").fingerprint
    (project / "m.fingerprint").write_text(fingerprint + "\n")
    note = {"format": 1, "name": "hooked", "version": "1.0.0", "fingerprint": fingerprint,
            "gate_results_at": "2099-01-01T00:00:00+00:00"}  # fmt: skip
    (project / "SERVING.json").write_text(json.dumps(note))
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "first")
    return hooks, project


def test_try_repo_runs_the_three_hooks_on_a_current_repository(repos: tuple[Path, Path], tmp_path: Path) -> None:
    hooks, project = repos
    home = tmp_path / "home"
    done = _try_repo(project, hooks, home, "--all-files", "--verbose")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _outcomes(done.stdout) == dict.fromkeys(HOOKS, "Passed")
    assert "skipped .gitlab-ci.yml: not a manifest" in done.stdout
    assert "hooked 1.0.0: valid" in done.stdout
    assert "current SERVING.json: m.yaml" in done.stdout and "current m.fingerprint" in done.stdout

    # an invalid manifest fails the validate hook, naming the field
    (project / "m.yaml").write_text(MANIFEST.replace("max_output_tokens: 16", "max_output_tokens: -1"))
    _git(project, "add", "m.yaml")
    done = _try_repo(project, hooks, home, "servegate-validate")
    assert done.returncode == 1 and "error: m.yaml:" in done.stdout and "max_output_tokens" in done.stdout


def test_try_repo_catches_a_stale_note_and_fingerprint(repos: tuple[Path, Path], tmp_path: Path) -> None:
    hooks, project = repos
    home = tmp_path / "home"
    # a served-behaviour change, staged without refreshing the note or the fingerprint
    (project / "m.yaml").write_text(MANIFEST.replace("max_output_tokens: 16", "max_output_tokens: 8"))
    _git(project, "add", "m.yaml")
    done = _try_repo(project, hooks, home)
    assert done.returncode == 1
    assert _outcomes(done.stdout) == {HOOKS[0]: "Passed", HOOKS[1]: "Failed", HOOKS[2]: "Failed"}
    assert "stale SERVING.json: fingerprint changed" in done.stdout
    assert "stale m.fingerprint: it records" in done.stdout

    # the fingerprint refreshed: its hook passes (the note stays stale until it is rewritten)
    (project / "m.fingerprint").write_text(load_manifest(project / "m.yaml").fingerprint + "\n")
    _git(project, "add", "m.fingerprint")
    done = _try_repo(project, hooks, home, "servegate-fingerprint-check")
    assert done.returncode == 0 and _outcomes(done.stdout) == {HOOKS[2]: "Passed"}

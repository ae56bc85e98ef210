"""`git:REV[:PATH]` manifests: `gate check --baseline`, `gate diff` and `gate note --check` read a revision with git."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import GateRun, in_process_gate

from servegate.contracts.git_revision import manifest_from_git
from servegate.contracts.loading import load_manifest

BASE = """\
apiVersion: servegate/v1
kind: ServedModel
name: gated
version: 1.0.0
weights: {source: zoo:tiny-primary}
preprocess: {chat_template: templates/chat.jinja, max_input_tokens: 64, truncation: left}
runtime:
  max_model_len: 128
  kv_cache: {block_size: 16, memory_budget: 1MiB}
batching: {mode: continuous, max_batch_size: 8, max_num_batched_tokens: 256}
postprocess: {max_output_tokens: 32}
failure_policy:
  fallback: {manifest: fallback.yaml, triggers: [overload, timeout]}
quality:
  suites:
    - {name: arith, dataset: suites/arith.jsonl, limit: 80, public: true}
  margins: {exact_match: 0.05}
"""

FALLBACK = """\
apiVersion: servegate/v1
kind: ServedModel
name: gated-fallback
weights: {source: zoo:tiny-fallback}
preprocess: {chat_template: none, max_input_tokens: 64, truncation: left}
runtime: {max_model_len: 128}
batching: {mode: dynamic, max_batch_size: 8}
postprocess: {max_output_tokens: 32}
"""

READ_AT_FIRST = ["base.yaml", "fallback.yaml", "m.yaml", "suites/arith.jsonl", "templates/chat.jinja"]
"""The files `m.yaml` names at the first commit: itself, its include, fallback, suite and chat template."""


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _commit(repo: Path, message: str) -> None:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", message)


def _manifest(method: str) -> str:
    return f"include: base.yaml\nruntime: {{quantization: {{method: {method}}}}}\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with two commits: int8 weights then int2, the chat template and a weights folder changed too."""
    root = tmp_path / "repo"
    (root / "suites").mkdir(parents=True)
    (root / "templates").mkdir()
    (root / "models" / "tiny").mkdir(parents=True)
    (root / "build" / "ckpt").mkdir(parents=True)
    _git(root, "init", "-q")
    zoo_arith = Path(__file__).parents[2] / "servegate" / "zoo" / "suites" / "arith.test.jsonl"
    (root / "suites" / "arith.jsonl").write_text("".join(zoo_arith.read_text().splitlines(True)[:80]))
    (root / "base.yaml").write_text(BASE)
    (root / "fallback.yaml").write_text(FALLBACK)
    (root / "templates" / "chat.jinja").write_text("first {{ messages }}")
    (root / "models" / "tiny" / "config.json").write_text('{"commit": 1}')
    (root / ".gitignore").write_text("build/\n")
    (root / "build" / "ckpt" / "config.json").write_text('{"built": true}')
    (root / "m.yaml").write_text(_manifest("int8-weight"))
    for name, source in (("tracked.yaml", "models/tiny"), ("built.yaml", "build/ckpt"), ("outside.yaml", "../w")):
        (root / name).write_text(f"include: base.yaml\nweights: {{source: {source}}}\n")
    _commit(root, "int8")
    (root / "m.yaml").write_text(_manifest("int2-weight"))
    (root / "templates" / "chat.jinja").write_text("second {{ messages }}")
    (root / "models" / "tiny" / "config.json").write_text('{"commit": 2}')
    _commit(root, "int2")
    (tmp_path / "w").mkdir()
    return root


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> GateRun:
    """Run the real entry point in process on fake engines; returns (exit code, stdout, stderr)."""
    return in_process_gate(monkeypatch, tmp_path, capsys)


def _blobs_at(repo: Path, revision: str, paths: list[str]) -> dict[str, str]:
    return {path: _git(repo, "rev-parse", f"{revision}:{path}") for path in paths}


def test_diff_reads_the_manifest_and_what_it_names_at_the_revision(gate, repo: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(repo)
    code, out, _ = gate("diff", "git:HEAD~1:m.yaml", "m.yaml", "--json", "-")
    assert code == 0
    report = json.loads(out)
    (change,) = report["changes"]["runtime"]
    assert (change["path"], change["old"], change["new"]) == (
        "runtime.quantization.method",
        "int8-weight",
        "int2-weight",
    )
    read = report["baseline_git"]
    assert read["commit"] == _git(repo, "rev-parse", "HEAD~1") and read["path"] == "m.yaml"
    assert read["blobs"] == _blobs_at(repo, "HEAD~1", READ_AT_FIRST)
    assert "candidate_git" not in report
    # PATH defaults to the other side's file; the table says where the baseline came from
    code, out, _ = gate("diff", "git:HEAD~1", str(repo / "m.yaml"))
    assert code == 0
    assert f"baseline: m.yaml read from git HEAD~1 (commit {read['commit']}" in out.replace("\n", "")
    assert "int8-weight" in out and "int2-weight" in out
    assert _git(repo, "status", "--porcelain") == ""


def test_the_revision_s_files_are_read_and_weights_resolve_as_declared(repo: Path, monkeypatch) -> None:  # noqa: ANN001
    with manifest_from_git("git:HEAD~1", repo / "m.yaml") as (path, read):
        served = load_manifest(path)
        assert served.resolve_path("templates/chat.jinja").read_text() == "first {{ messages }}"
        assert served.runtime.quantization.method == "int8-weight"
        mirror = path.parent
    assert not mirror.exists()
    assert read.working_tree == [] and read.outside_repository == []

    monkeypatch.chdir(repo)  # PATH given: the repository is the current directory's
    with manifest_from_git("git:HEAD~1:tracked.yaml") as (path, read):
        source = load_manifest(path).resolve_path("models/tiny")
        assert (source / "config.json").read_text() == '{"commit": 1}'  # the revision's, not the working tree's
        assert read.blobs["models/tiny/config.json"] == _git(repo, "rev-parse", "HEAD~1:models/tiny/config.json")

    with manifest_from_git("git:HEAD:built.yaml") as (path, read):
        source = load_manifest(path).resolve_path("build/ckpt")
        assert (source / "config.json").read_text() == '{"built": true}'  # ignored: read in the working tree
        assert read.working_tree == ["build/ckpt"]

    with manifest_from_git("git:HEAD:outside.yaml") as (path, read):
        assert load_manifest(path).resolve_path("../w").resolve() == (repo.parent / "w").resolve()
        assert read.outside_repository == [str((repo.parent / "w").resolve())]


def test_check_against_a_git_baseline_runs_the_gates_the_change_triggers(gate, repo: Path, tmp_path: Path) -> None:  # noqa: ANN001
    report_file = tmp_path / "report.json"
    code, out, _ = gate("check", "--baseline", "git:HEAD~1", "--candidate", str(repo / "m.yaml"),
                        "--json", str(report_file))  # fmt: skip
    assert code == 1, out
    report = json.loads(report_file.read_text())
    gates = {g["name"]: g for g in report["gates"]}
    assert gates["quantization"]["verdict"] == "fail"
    assert gates["quantization"]["triggered_by"] == ["changed: runtime.quantization.method"]
    assert gates["truncation"]["verdict"] == "skipped"
    read = report["baseline_git"]
    assert read["commit"] == _git(repo, "rev-parse", "HEAD~1")
    assert read["blobs"] == _blobs_at(repo, "HEAD~1", READ_AT_FIRST)
    assert report["notes"][0].startswith("baseline: m.yaml read from git HEAD~1")
    assert _git(repo, "status", "--porcelain") == ""

    code, _, _ = gate(
        "check", "--baseline", "git:HEAD", "--candidate", str(repo / "m.yaml"), "--json", str(report_file)
    )
    assert code == 0
    assert json.loads(report_file.read_text())["baseline_git"]["commit"] == _git(repo, "rev-parse", "HEAD")


def test_note_check_reads_the_manifest_at_a_revision(gate, repo: Path, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(repo)
    note = tmp_path / "SERVING.json"  # a note's metadata: what --check compares with the manifest
    fingerprint = load_manifest(repo / "m.yaml").fingerprint
    note.write_text(json.dumps({"fingerprint": fingerprint, "gate_results_at": "2099-01-01T00:00:00+00:00"}))
    code, out, _ = gate("note", "--check", str(note), "git:HEAD:m.yaml", "--json", "-")
    assert code == 0
    assert json.loads(out)["manifest_git"]["commit"] == _git(repo, "rev-parse", "HEAD")
    code, out, _ = gate("note", "--check", str(note), "git:HEAD~1:m.yaml")
    assert code == 1 and "stale" in out


def test_no_path_for_a_note_is_one_line(gate, repo: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(repo)
    code, _, err = gate("note", "--check", "SERVING.md", "git:HEAD")
    assert code == 2 and err.splitlines() == [
        "error: git:HEAD: name the manifest's path in the repository: git:REV:PATH"
    ]


def _shallow(repo: Path) -> Path:
    clone = repo.parent / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(clone)], check=True)
    return clone


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown revision", "git:no-such-branch: unknown revision 'no-such-branch' in "),
        ("path absent", "git:HEAD~1:gone.yaml: gone.yaml is absent at HEAD~1 (commit "),
        (
            "shallow clone",
            "git:HEAD~1: this shallow clone lacks revision 'HEAD~1': fetch it with git fetch --unshallow",
        ),
        (
            "shallow branch",
            "git:origin/old: this shallow clone lacks revision 'origin/old': fetch it with git fetch "
            "origin old, or git fetch --unshallow",
        ),
        ("not a repository", "git:HEAD: "),
        ("no git", "git:HEAD~1: git is not installed (not on PATH)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(  # noqa: ANN001
    gate, repo: Path, tmp_path: Path, monkeypatch, case: str, expected: str
) -> None:
    candidate = repo / "m.yaml"
    spec = expected.split(": ", 1)[0]
    if case.startswith("shallow"):
        candidate = _shallow(repo) / "m.yaml"
    elif case == "not a repository":
        candidate = tmp_path / "plain" / "m.yaml"
        candidate.parent.mkdir()
        candidate.write_text(_manifest("int8-weight"))
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    elif case == "no git":
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, _, err = gate("diff", spec, str(candidate))
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith(f"error: {expected}"), line
    if case == "not a repository":
        assert line.endswith("is not in a git repository: give a manifest file instead")
    code, _, err = gate("check", "--baseline", spec, "--candidate", str(candidate))
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"error: {expected}")

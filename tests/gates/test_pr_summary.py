"""`gate check --summary`: the pull-request summary, its figures, the diff, and the comment size limit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.cli import GateRun, in_process_gate

from servegate.gates.pr_summary import MARKER, pr_summary, run_page
from servegate.gates.result import GateReport, GateResult

SIDE = {"name": "m", "version": "1.0.0", "fingerprint": "f" * 64, "form": "manifest"}


def _report(gates: list[GateResult]) -> GateReport:
    return GateReport(baseline=dict(SIDE), candidate={**SIDE, "fingerprint": "c" * 64}, gates=gates, mode="change")


def test_a_huge_report_is_cut_to_the_limit_with_a_link_to_the_full_one() -> None:
    evidence = [{"suite": "s", "id": f"item-{i}", "prompt": "x" * 400, "baseline": "a", "candidate": "b"}
                for i in range(400)]  # fmt: skip
    report = _report([GateResult("quality", "fail", "worse", evidence=evidence, triggered_by=["changed: weights"]),
                      GateResult("batching", "skipped", "no watched field changed")])  # fmt: skip
    changes = {"runtime": [{"path": f"runtime.f{i}", "old": i, "new": i + 1, "gates": ["quality"]} for i in range(5)]}
    env = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "7"}
    whole = pr_summary(report, changes, full_report="out/report.json", environ=env, limit=10**7)
    assert len(whole.encode()) > 65536 and "failure examples" in whole
    cut = pr_summary(report, changes, full_report="out/report.json", environ=env)
    assert len(cut.encode()) <= 65536
    assert cut.startswith(MARKER + "\n### gate check: m 1.0.0: **FAIL**")
    assert "| quality | **FAIL** | — | — | worse |" in cut
    assert "Skipped: batching." in cut
    assert "| runtime.f4 | `4` | `5` | quality |" in cut
    assert cut.rstrip().endswith(
        "_Cut to fit a comment: the full report is `out/report.json` and "
        "[the CI run](https://github.com/o/r/actions/runs/7)._"
    )
    tiny = pr_summary(report, changes, environ={}, limit=600)  # even the table is cut, at a line
    assert len(tiny.encode()) <= 600 and "the --json report of this check" in tiny


def test_the_ci_run_page_comes_from_github_or_gitlab() -> None:
    assert run_page({"CI_JOB_URL": "https://gitlab.example/p/-/jobs/3"}) == "https://gitlab.example/p/-/jobs/3"
    assert run_page({}) is None


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> GateRun:
    return in_process_gate(monkeypatch, tmp_path, capsys)


def test_check_writes_the_summary_of_a_git_baseline(gate: GateRun, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    repo = tmp_path / "repo"
    repo.mkdir()
    zoo_arith = Path(__file__).parents[2] / "servegate" / "zoo" / "suites" / "arith.test.jsonl"
    (repo / "arith.jsonl").write_text("".join(zoo_arith.read_text().splitlines(True)[:80]))
    manifest = (
        "kind: ServedModel\nname: s\nweights: {source: zoo:tiny-primary}\npreprocess: {max_input_tokens: 64}\n"
        "runtime: {max_model_len: 128, quantization: {method: %s}}\npostprocess: {max_output_tokens: 32}\n"
        "quality:\n  suites: [{name: arith, dataset: arith.jsonl, public: true}]\n  margins: {exact_match: 0.05}\n"
    )
    (repo / "m.yaml").write_text(manifest % "int8-weight")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    (repo / "m.yaml").write_text(manifest % "int2-weight")
    monkeypatch.delenv("GITHUB_RUN_ID", raising=False)
    monkeypatch.delenv("CI_JOB_URL", raising=False)
    summary = tmp_path / "summary.md"
    code, out, _ = gate("check", "--baseline", "git:HEAD", "--candidate", str(repo / "m.yaml"),
                        "--json", str(tmp_path / "r.json"), "--summary", str(summary))  # fmt: skip
    assert code == 1, out
    text = summary.read_text()
    assert "### gate check: s 0.0.0: **FAIL**" in text
    assert "Baseline: m.yaml read from git HEAD" in text
    assert "| quantization | **FAIL** | arith/exact_match Δ -" in text
    assert '| runtime.quantization.method | `"int8-weight"` | `"int2-weight"` |' in text
    assert "<details><summary>quantization: fail</summary>" in text and "failure examples" in text
    assert text.rstrip().endswith(f"Full report: `{tmp_path / 'r.json'}`.")

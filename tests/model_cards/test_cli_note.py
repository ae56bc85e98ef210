"""`gate note` from the command line: files written, one-line errors (exit 2), `--check` exit codes (0 / 1)."""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import ModelCard
from note_evidence import dump, make_bench, make_plan, make_report, quickstart_sets, run_gate

from servegate.contracts.loading import load_manifest


def _sets() -> list[str]:
    return [arg for s in quickstart_sets() for arg in ("--set", s)]


def test_write_then_check_then_stale(quickstart_copy: Path, tmp_path: Path) -> None:
    served = load_manifest(quickstart_copy, quickstart_sets())
    report = dump(tmp_path / "check.json", make_report(served))
    bench = dump(tmp_path / "bench.json", make_bench())
    plan = dump(tmp_path / "plan.json", make_plan())
    card = tmp_path / "README.md"
    card.write_text("---\nlicense: apache-2.0\n---\n# Card\n", encoding="utf-8")
    out = tmp_path / "SERVING.md"
    args = [str(quickstart_copy), "--report", str(report), "--bench", str(bench), "--plan", str(plan)]
    done = run_gate("note", *args, "-o", str(out), "--model-card", str(card), "--json", "-", *_sets())
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["fingerprint"] == served.fingerprint and result["verdict"] == "pass"
    assert out.is_file() and Path(result["json"]).is_file() and len(result["plots"]) == 2
    assert ModelCard.load(card).data.license == "apache-2.0"

    fresh = run_gate("note", "--check", str(out), str(quickstart_copy), *_sets())
    assert fresh.returncode == 0, fresh.stderr
    assert "current" in fresh.stdout

    stale = run_gate("note", "--check", str(out), str(quickstart_copy), *_sets(), "--set", "batching.max_batch_size=16")
    assert stale.returncode == 1
    assert "fingerprint changed" in stale.stdout


def test_missing_report_is_one_line_per_item_and_exit_2(quickstart_copy: Path, tmp_path: Path) -> None:
    done = run_gate("note", str(quickstart_copy), "-o", str(tmp_path / "SERVING.md"), *_sets())
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: serving note: quality gate is missing: run `gate check MANIFEST --json check.json` "
        "and pass --report check.json"
    ]
    assert not (tmp_path / "SERVING.md").exists()


def test_a_report_of_an_older_format_is_refused_in_one_line(quickstart_copy: Path, tmp_path: Path) -> None:
    served = load_manifest(quickstart_copy, quickstart_sets())
    old = make_report(served)
    del old["format_version"]  # as servegate wrote reports before they had a version
    report = dump(tmp_path / "check.json", old)
    done = run_gate("note", str(quickstart_copy), "--report", str(report), "-o", str(tmp_path / "SERVING.md"), *_sets())
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {report}: a check report of format 0; this servegate reads format 1 only: rerun "
        "`gate check MANIFEST --json check.json` to write one"
    ]
    assert not (tmp_path / "SERVING.md").exists()

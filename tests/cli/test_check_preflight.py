"""`gate check` and `gate note` refuse what they can know is wrong before any gate runs: one line each, exit 2.

The console entry point runs in this process with the gate runner and the engine builder replaced by ones that
record a call, so each test sees that nothing was gated and no model was built, without timing anything.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from servegate.cli.app import main

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "examples/quickstart/manifest.yaml"
NO_CARD = ["--set", "card.public_name=null", "--set", "card.model_class=null"]


class Reached(Exception):
    """Raised by the stand-in gate runner: the command got past its checks to the gating itself."""


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """Records every gate run and engine build the command attempts (each one also stops the command)."""
    import servegate.gates.base as base
    import servegate.gates.check as check

    calls: list[str] = []

    def run_check(*args: Any, **kwargs: Any) -> Any:
        calls.append("run_check")
        raise Reached

    def build(served: Any) -> Any:
        calls.append(f"engine {served.name}")
        raise Reached

    monkeypatch.setattr(check, "run_check", run_check)
    monkeypatch.setattr(base, "default_engine_factory", build)
    monkeypatch.setenv("SERVEGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    return calls


def gate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run `gate ARGS` through the real entry point (its error handler included): exit code and stderr."""
    monkeypatch.setattr(sys, "argv", ["gate", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return int(exited.value.code or 0), capsys.readouterr().err


def error_lines(stderr: str) -> list[str]:
    """The `error: ...` lines of a refused command."""
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_note_without_card_identity_is_refused_before_any_gate(
    gated: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    note = tmp_path / "SERVING.md"
    code, err = gate(monkeypatch, capsys, "check", str(QUICKSTART), *NO_CARD, "--note", str(note))
    assert code == 2, err
    assert error_lines(err) == [
        "error: serving note: model identity is missing: set card.public_name (the published name) or "
        "card.model_class (a generic class) in the manifest"
    ]
    assert gated == [] and not note.exists()


def test_note_items_the_manifest_lacks_are_each_named(
    gated: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sets = ["--set", "card.observability=metrics only", "--set", "capacity.workload=null"]
    code, err = gate(monkeypatch, capsys, "check", str(QUICKSTART), *NO_CARD, *sets, "--note", str(tmp_path / "N.md"))
    assert code == 2 and gated == []
    lines = error_lines(err)
    assert len(lines) == 3, lines
    assert "card.public_name" in lines[0]
    assert "workload shape is missing: declare capacity.workload" in lines[1]
    assert "card.observability must say that raw request text is not logged" in lines[2]


def test_the_note_must_be_markdown_and_its_twin_must_not_overwrite_the_report(
    gated: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = gate(monkeypatch, capsys, "check", str(QUICKSTART), "--note", str(tmp_path / "note.txt"))
    assert code == 2 and gated == []
    assert error_lines(err) == [
        f"error: --note {tmp_path / 'note.txt'}: the note is written as Markdown: give a .md path, e.g. SERVING.md "
        f"(got {tmp_path / 'note.txt'})"
    ]
    report = tmp_path / "SERVING.json"
    code, err = gate(
        monkeypatch, capsys, "check", str(QUICKSTART), "--json", str(report), "--note", str(report.with_suffix(".md"))
    )
    assert code == 2 and gated == []
    assert error_lines(err) == [
        f"error: --note (its JSON twin) {report}: --json writes the same file: give the two different paths"
    ]


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path / "out"


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "plain").write_text("x")
    return tmp_path / "plain" / "sub" / "report.out"


def _read_only(tmp_path: Path) -> Path:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    return folder / "report.out"


@pytest.mark.parametrize("option", ["--json", "--junit", "--markdown"])
@pytest.mark.parametrize(
    ("where", "says"),
    [
        (_folder, "is a folder, not a file: give a file path, e.g."),
        (_under_a_file, "is a file, so no folder can be made there: choose another path"),
        pytest.param(
            _read_only,
            "cannot write in",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder"),
        ),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_any_gate(
    gated: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    option: str,
    where: Any,
    says: str,
) -> None:
    target = where(tmp_path)
    code, err = gate(monkeypatch, capsys, "check", str(QUICKSTART), option, str(target))
    assert code == 2 and gated == []
    (line,) = error_lines(err)
    assert line.startswith(f"error: {option} {target}: ") and says in line, line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a file system nobody can write (procfs)")
def test_an_output_on_a_file_system_nobody_can_write_is_refused(
    gated: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = gate(monkeypatch, capsys, "check", str(QUICKSTART), "--markdown", "/proc/servegate-test/gates.md")
    assert code == 2 and gated == []
    (line,) = error_lines(err)
    assert line.startswith("error: --markdown /proc/servegate-test/gates.md: cannot write in /proc (")


def test_a_suite_line_that_is_not_json_and_an_unknown_gate_are_named_together(
    gated: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "qs"
    shutil.copytree(QUICKSTART.parent, folder)
    (folder / "broken.jsonl").write_text('{"id": "1", "prompt": "1+1=", "reference": "2"}\n{"id": 2, oops\n')
    manifest = folder / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("dataset: zoo:arith", "dataset: broken.jsonl", 1))
    code, err = gate(monkeypatch, capsys, "check", str(manifest), "--gate", "qualty", "--gate", "quality")
    assert code == 2 and gated == []
    assert error_lines(err) == [
        "error: --gate qualty: unknown gate 'qualty'; did you mean 'quality'? Available: batching, caching, "
        "capacity, contract, fallback, load, quality, quantization, truncation",
        f"error: quality.suites[arith].dataset: {folder / 'broken.jsonl'} line 2 is not JSON (Expecting property "
        "name enclosed in double quotes, column 11): fix that line",
    ]


def test_a_change_check_is_checked_the_same_way(
    gated: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pair = ["--baseline", str(QUICKSTART), "--candidate", str(QUICKSTART), *NO_CARD]
    code, err = gate(monkeypatch, capsys, "check", *pair, "--note", str(tmp_path / "N.md"), "--junit", str(tmp_path))
    assert code == 2 and gated == []
    lines = error_lines(err)
    assert lines[0].startswith(f"error: --junit {tmp_path}: is a folder") and "model identity is missing" in lines[1]


def test_a_check_with_every_output_writable_reaches_the_gates(
    gated: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    outputs = ["--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "new" / "g.xml")]
    outputs += ["--markdown", str(tmp_path / "g.md"), "--note", str(tmp_path / "notes" / "SERVING.md")]
    monkeypatch.setattr(sys, "argv", ["gate", "check", str(QUICKSTART), "--gate", "quality", *outputs])
    with pytest.raises(Reached):
        main()
    assert gated == ["run_check"]
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".servegate-probe-*"))  # the probe left nothing


def test_gate_note_refuses_an_output_folder_before_reading_its_evidence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "check.json"  # not written: the output is named first
    code, err = gate(
        monkeypatch,
        capsys,
        "note",
        str(QUICKSTART),
        "--report",
        str(missing),
        "-o",
        str(tmp_path / "N.md"),
        "--model-card",
        str(tmp_path),
    )
    assert code == 2
    assert error_lines(err) == [
        f"error: --model-card {tmp_path}: is a folder, not a file: give a file path, e.g. {tmp_path / 'README.md'}"
    ]

"""`gate note --check`: a note is stale when the fingerprint moved or its gate results are older than the manifest."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from note_evidence import make_report, quickstart_sets

from servegate.contracts.loading import load_manifest
from servegate.model_cards.evidence import NoteError
from servegate.model_cards.note import twin_path
from servegate.model_cards.note_files import write_note
from servegate.model_cards.stale import check_note


def _write(manifest: Path, out: Path, sets: list[str] | None = None, created_at: str | None = None) -> None:
    served = load_manifest(manifest, quickstart_sets() + (sets or []))
    report = make_report(served) if created_at is None else make_report(served, created_at=created_at)
    write_note(served, report, out)


def test_a_fresh_note_is_current(quickstart_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    _write(quickstart_copy, out)
    assert check_note(out, load_manifest(quickstart_copy, quickstart_sets())) == []


def test_changed_fingerprint_is_stale(quickstart_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    _write(quickstart_copy, out)
    changed = load_manifest(quickstart_copy, [*quickstart_sets(), "runtime.quantization.method=int4-weight"])
    reasons = check_note(out, changed)
    assert len(reasons) == 1 and reasons[0].startswith("fingerprint changed")
    assert reasons[0].endswith("(changed element(s): runtime)")  # named, not only "the fingerprint moved"
    two = load_manifest(quickstart_copy, [*quickstart_sets(), "runtime.seed=7", "batching.max_batch_size=4"])
    assert check_note(out, two)[0].endswith("(changed element(s): runtime, batching)")
    both = load_manifest(
        quickstart_copy, [*quickstart_sets(), "runtime.quantization.method=int4-weight", "card.license=MIT"]
    )
    reasons = check_note(out, both)
    assert len(reasons) == 2 and "section(s): card" in reasons[1]


def test_manifest_edited_after_the_note_is_stale(quickstart_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    _write(quickstart_copy, out)
    text = quickstart_copy.read_text(encoding="utf-8").replace(
        "margins:\n    exact_match: 0.03", "margins:\n    exact_match: 0.2"
    )
    quickstart_copy.write_text(text, encoding="utf-8")
    edited = load_manifest(quickstart_copy, quickstart_sets())
    reasons = check_note(out, edited)
    assert len(reasons) == 1 and "older than the manifest" in reasons[0] and "quality" in reasons[0]


def test_report_older_than_manifest_is_stale(quickstart_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    now = time.time()
    os.utime(quickstart_copy, (now, now))
    served = load_manifest(quickstart_copy, quickstart_sets())
    note = write_note(served, make_report(served, created_at="2001-01-01T00:00:00+00:00"), out)
    assert any("older than the manifest" in w for w in note.warnings)  # said when written, too
    reasons = check_note(out, served)
    assert reasons and "gate results (2001-01-01T00:00:00+00:00) are older than the manifest" in reasons[0]


def test_check_reads_the_json_twin_when_the_markdown_lost_its_metadata(quickstart_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "SERVING.md"
    _write(quickstart_copy, out)
    out.write_text(out.read_text(encoding="utf-8").split("\n", 1)[1], encoding="utf-8")  # drop the metadata line
    served = load_manifest(quickstart_copy, quickstart_sets())
    assert check_note(out, served) == []
    twin_path(out).unlink()
    with pytest.raises(NoteError, match="not a servegate serving note"):
        check_note(out, served)

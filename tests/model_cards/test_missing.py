"""A missing checklist item stops the note with a message naming the manifest field or command that supplies it."""

from __future__ import annotations

from pathlib import Path

import pytest
from note_evidence import dump, make_bench, make_plan, make_report

from servegate.contracts.manifest import ServedModel
from servegate.model_cards.evidence import Evidence, NoteError
from servegate.model_cards.note import build_note
from servegate.model_cards.note_files import write_note


def _error(served: ServedModel, evidence: Evidence) -> str:
    with pytest.raises(NoteError) as caught:
        build_note(served, evidence)
    return str(caught.value)


def test_no_check_report_names_gate_check(served: ServedModel) -> None:
    message = _error(served, Evidence.from_data(bench=make_bench()))
    assert "quality gate is missing" in message
    assert "gate check MANIFEST --json check.json" in message and "--report check.json" in message


def test_no_capacity_source_names_bench_and_targets(served: ServedModel) -> None:
    bare = served.with_changes(capacity={"workload": served.capacity.workload})
    message = _error(bare, Evidence.from_data(report=make_report(bare)))
    assert "capacity target is missing" in message
    assert (
        "run `gate bench MANIFEST --json bench.json` and pass --bench bench.json, or declare capacity.targets"
        in message
    )


@pytest.mark.parametrize("source", ["bench", "plan"])
def test_capacity_from_evidence_alone_is_enough(served: ServedModel, source: str) -> None:
    bare = served.with_changes(capacity={"workload": served.capacity.workload})
    evidence = Evidence.from_data(
        report=make_report(bare), **{source: make_bench() if source == "bench" else make_plan()}
    )
    rows = build_note(bare, evidence).items["capacity_target"]["rows"]
    assert rows and all(r["target"] is None for r in rows)


def test_no_workload_names_capacity_workload(served: ServedModel) -> None:
    bare = served.with_changes(capacity={"targets": served.capacity.targets})
    message = _error(bare, Evidence.from_data(report=make_report(bare)))
    assert "workload shape is missing" in message and "capacity.workload" in message


def test_no_identity_names_card_fields(served: ServedModel) -> None:
    anonymous = served.with_changes(card={"observability": served.card.observability})
    message = _error(anonymous, Evidence.from_data(report=make_report(anonymous)))
    assert "model identity is missing" in message
    assert "card.public_name" in message and "card.model_class" in message


def test_hub_weights_without_checksums_name_weights_sha256(served: ServedModel) -> None:
    hub = served.with_changes(weights={"source": "hf:org/model@main"})
    message = _error(hub, Evidence.from_data(report=make_report(hub)))
    assert "weight checksums" in message and "weights.sha256" in message


def test_observability_must_say_raw_input_is_not_logged(served: ServedModel) -> None:
    loud = served.with_changes(card={**served.card.model_dump(), "observability": "We keep request logs for 30 days."})
    message = _error(loud, Evidence.from_data(report=make_report(loud)))
    assert "observability" in message and "card.observability" in message and "not logged" in message


def test_every_missing_item_is_named_at_once(served: ServedModel) -> None:
    bare = served.with_changes(capacity={}, card={"observability": ""})
    lines = _error(bare, Evidence()).splitlines()
    for item in ("model identity", "workload shape", "capacity target", "quality gate", "observability"):
        assert any(f"{item} is missing" in line for line in lines), item


def test_report_for_another_fingerprint_is_refused(served: ServedModel) -> None:
    report = {**make_report(served), "fingerprint": "0" * 64}
    message = _error(served, Evidence.from_data(report=report))
    assert "000000000000" in message and served.fingerprint[:12] in message and "rerun `gate check" in message


def test_wrong_evidence_file_is_named(served: ServedModel, tmp_path: Path) -> None:
    bench_file = dump(tmp_path / "bench.json", make_bench())
    with pytest.raises(NoteError, match="this is a bench file .* pass it as --bench"):
        Evidence.from_files(report=bench_file)
    with pytest.raises(NoteError, match="no such file; write it with `gate plan"):
        Evidence.from_files(plan=tmp_path / "nope.json")
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(NoteError, match="not valid JSON"):
        Evidence.from_files(report=tmp_path / "broken.json")


def test_nothing_is_written_when_an_item_is_missing(served: ServedModel, tmp_path: Path) -> None:
    with pytest.raises(NoteError):
        write_note(served.with_changes(capacity={}), make_report(served.with_changes(capacity={})), tmp_path / "S.md")
    assert list(tmp_path.iterdir()) == []

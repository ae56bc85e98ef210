"""Writing a serving note: Markdown, its JSON twin, the plots and the model card's section, after the scan.

`write_note_files` builds the note (note.py), renders it (render_markdown.py), checks every text it will
write against the private suites (public_safety.py), and only then writes the files.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from servegate.contracts.files import write_atomic
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.capacity_evidence import BenchEvidence, PlanEvidence
from servegate.model_cards.evidence import Evidence, NoteError, parse_time
from servegate.model_cards.model_card import update_model_card_text
from servegate.model_cards.note import ServingNote, build_note, twin_path
from servegate.model_cards.plots import prepare_plots, write_plots
from servegate.model_cards.public_safety import PublicFilter
from servegate.model_cards.render_markdown import render_markdown


def check_note_path(out_path: Path) -> None:
    """A NoteError unless `out_path` names a Markdown file (the JSON twin goes beside it)."""
    if out_path.suffix.lower() != ".md":
        raise NoteError(f"the note is written as Markdown: give a .md path, e.g. SERVING.md (got {out_path})")


def write_note_files(
    served: ServedModel, evidence: Evidence, out_path: Path, model_card: Path | None = None
) -> ServingNote:
    """Build the note, render it, scan it for private text, then write Markdown, JSON twin, plots and the card."""
    check_note_path(out_path)
    pf = PublicFilter(served)
    note = build_note(served, evidence, pf)
    plots = prepare_plots(evidence.bench, evidence.base_dir, out_path) if evidence.bench is not None else []
    note.plots = [meta for meta, _ in plots]
    markdown = render_markdown(note)
    twin = note.to_json()
    card_text = None
    if model_card is not None:
        card_text = update_model_card_text(
            model_card.read_text(encoding="utf-8") if model_card.is_file() else "",
            note,
            served,
            note_path=out_path,
            card_dir=model_card.parent,
        )
    pf.assert_public(markdown, twin, card_text or "")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_plots(plots, out_path)
    write_atomic(twin_path(out_path), twin)
    write_atomic(out_path, markdown)
    if model_card is not None and card_text is not None:
        write_atomic(model_card, card_text)
    return note


def write_note(
    served: ServedModel,
    report: Any,
    out_path: str | Path,
    bench: BenchEvidence | dict[str, Any] | None = None,
    plan: PlanEvidence | dict[str, Any] | None = None,
    *,
    model_card: str | Path | None = None,
    report_at: datetime | str | None = None,
) -> ServingNote:
    """Write the serving note for `served` from a check report just produced (`gate check ... --note`).

    `report` is the CheckReport, its JSON-ready dict, or anything with a `to_report()` giving one (the
    GateReport `gate check` returns); its time is its `created_at`, else `report_at`, else now. Raises NoteError
    (a ServegateError) when an item is missing.
    """
    if hasattr(report, "to_report"):
        report = report.to_report()
    when = parse_time(report_at) if isinstance(report_at, str) else report_at
    evidence = Evidence.from_data(report=report, bench=bench, plan=plan, report_at=when)
    return write_note_files(served, evidence, Path(out_path), Path(model_card) if model_card else None)

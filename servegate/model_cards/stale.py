"""Is a written serving note still true of its manifest? (`gate note --check SERVING.md MANIFEST`)

A note is stale when
- its fingerprint is not the manifest's (a behaviour-defining field or a weight checksum changed), or
- its gate results are older than the manifest: the manifest was edited after the gates ran (its
  content differs from the one the note was written from, or it was already newer than the results
  when the note was written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servegate.contracts.manifest import SIX_ELEMENTS, ServedModel
from servegate.model_cards.evidence import NoteError, parse_time
from servegate.model_cards.note import CLOCK_SLACK, manifest_digests, twin_path


def read_note_metadata(note_path: Path) -> dict[str, Any]:
    """The note's metadata: the line embedded in the Markdown, else its JSON twin."""
    from servegate.model_cards.render_markdown import read_metadata

    if not note_path.is_file():
        raise NoteError(f"{note_path}: no such note; write it with `gate note MANIFEST ... -o {note_path}`")
    text = note_path.read_text(encoding="utf-8")
    if note_path.suffix.lower() == ".json":
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NoteError(f"{note_path}: not valid JSON ({exc})") from None
        return data
    try:
        return read_metadata(text)
    except NoteError:
        twin = twin_path(note_path)
        if twin.is_file():
            return read_note_metadata(twin)
        raise


def stale_reasons(meta: dict[str, Any], served: ServedModel) -> list[str]:
    """Why a note with this metadata no longer describes `served` (empty when it still does)."""
    reasons = []
    digest, sections = manifest_digests(served)
    old = meta.get("section_sha256") or {}
    changed = sorted(k for k in set(old) | set(sections) if old.get(k) != sections.get(k)) if old else []
    if meta.get("fingerprint") != served.fingerprint:
        elements = [k for k in SIX_ELEMENTS if k in changed]
        what = (
            f"changed element(s): {', '.join(elements)}"
            if elements  # a note written before section digests were kept cannot say which
            else "a behaviour-defining field or a weight checksum changed"
        )
        reasons.append(
            f"fingerprint changed: the note describes {str(meta.get('fingerprint'))[:12]}, the manifest is now "
            f"{served.fingerprint[:12]} ({what})"
        )
    results_at, modified_then = parse_time(meta.get("gate_results_at")), parse_time(meta.get("manifest_modified_at"))
    if meta.get("manifest_sha256") and meta["manifest_sha256"] != digest:
        if reasons:  # the fingerprint reason already covers the six elements
            changed = [k for k in changed if k not in SIX_ELEMENTS]
        if changed or not reasons:
            reasons.append(
                "gate results are older than the manifest: it changed after the note was written "
                f"(section(s): {', '.join(changed) or 'unknown'})"
            )
    elif results_at and modified_then and results_at + CLOCK_SLACK < modified_then:
        reasons.append(
            f"gate results ({results_at.isoformat(timespec='seconds')}) are older than the manifest "
            f"({modified_then.isoformat(timespec='seconds')}) they were written against"
        )
    if results_at is None:
        reasons.append("the note does not say when its gate results were produced")
    return reasons


def check_note(note_path: Path, served: ServedModel) -> list[str]:
    """Reasons the note at `note_path` is stale for `served` (empty: it is current)."""
    return stale_reasons(read_note_metadata(note_path), served)

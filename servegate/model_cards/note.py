"""The serving note: the seven items of the public serving checklist, built from a manifest and its evidence.

    note = model identity + input contract + output contract + workload shape + capacity target
           + quality gate + observability

`build_note` makes the ServingNote (plain data); `servegate.model_cards.note_files` writes it as Markdown
with a JSON twin (and the plots), after the public-safety scan; `servegate.model_cards.stale` checks a
written note.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from servegate import __version__
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.capacity_evidence import BenchEvidence
from servegate.contracts.report.check_report import CheckReport
from servegate.contracts.report.measurements import CapacityMeasurements
from servegate.model_cards.evidence import Evidence, NoteError, as_bench, file_time, iso
from servegate.model_cards.items_capacity import capacity_target, workload_shape
from servegate.model_cards.items_contract import input_contract, model_identity, output_contract
from servegate.model_cards.items_observability import observability
from servegate.model_cards.items_quality import quality_gate
from servegate.model_cards.public_safety import PublicFilter

NOTE_FORMAT = 1
"""Version of the note's JSON form."""
ITEMS: tuple[tuple[str, str], ...] = (
    ("model_identity", "Model identity"),
    ("input_contract", "Input contract"),
    ("output_contract", "Output contract"),
    ("workload_shape", "Workload shape"),
    ("capacity_target", "Capacity target"),
    ("quality_gate", "Quality gate"),
    ("observability", "Observability"),
)
"""The seven checklist items in order: (key in the JSON twin, heading in the Markdown)."""
CLOCK_SLACK = timedelta(seconds=1)  # timestamps written at one-second precision must not look older than they are


def manifest_digests(served: ServedModel) -> tuple[str, dict[str, str]]:
    """sha256 of the whole manifest's canonical form, and a short one of each section (to name what changed)."""
    data = served.model_dump(mode="json")

    def digest(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    return digest(data), {key: digest(value)[:16] for key, value in data.items()}


@dataclass
class ServingNote:
    """A written serving note: what it was written from (fingerprint, digests, times) and the seven items."""

    name: str
    version: str
    fingerprint: str
    """The manifest fingerprint the note describes (the six elements + weight checksums)."""
    manifest_sha256: str
    """Digest of the whole manifest (cosmetic fields too) when the note was written."""
    section_sha256: dict[str, str]
    """Digest per top-level manifest section, so --check can say which section changed."""
    gate_results_at: str
    """When the gate results in the note were produced (UTC, ISO 8601)."""
    written_at: str
    """When the note was written."""
    verdict: str
    """The check report's overall verdict."""
    items: dict[str, dict[str, Any]]
    """Checklist item key -> its content (see ITEMS)."""
    manifest_modified_at: str | None = None
    """The manifest file's modification time when the note was written (None for a manifest built in code)."""
    plots: list[dict[str, str]] = field(default_factory=list)
    """{title, path}: PNGs next to the note, paths relative to it."""
    warnings: list[str] = field(default_factory=list)
    """Things the writer should know (e.g. gate results older than the manifest)."""
    format: int = NOTE_FORMAT
    servegate_version: str = __version__

    @property
    def title(self) -> str:
        """The name the note is published under: the public name, else the model class."""
        identity = self.items["model_identity"]
        return str(identity.get("public_name") or identity.get("model_class") or self.name)

    def metadata(self) -> dict[str, Any]:
        """The fields `gate note --check` needs (also embedded in the Markdown)."""
        keys: tuple[str, ...] = ("format", "name", "version", "fingerprint", "manifest_sha256", "section_sha256")
        keys += ("gate_results_at", "manifest_modified_at", "written_at", "verdict")
        data = asdict(self)
        return {k: data[k] for k in keys}

    def to_dict(self) -> dict[str, Any]:
        """The JSON twin."""
        return asdict(self)

    def to_json(self) -> str:
        """The JSON twin as text."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingNote:
        """Read a JSON twin back; a NoteError when it is not one."""
        if not isinstance(data, dict) or data.get("format") != NOTE_FORMAT:
            raise NoteError(f"not a servegate serving note (format {NOTE_FORMAT} expected)")
        missing_items = [key for key, _ in ITEMS if key not in data.get("items", {})]
        if missing_items:
            raise NoteError(f"serving note lacks the item(s): {', '.join(missing_items)}")
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json(cls, text: str) -> ServingNote:
        """Parse a JSON twin."""
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise NoteError(f"serving note JSON does not parse: {exc}") from None


def _build_items(
    served: ServedModel, evidence: Evidence, safe_report: CheckReport | None, pf: PublicFilter
) -> dict[str, dict[str, Any]]:
    """All seven items; every missing one is named in a single error."""
    builders = {
        "model_identity": lambda: model_identity(served),
        "input_contract": lambda: input_contract(served),
        "output_contract": lambda: output_contract(served),
        "workload_shape": lambda: workload_shape(served, evidence),
        "capacity_target": lambda: capacity_target(served, evidence),
        "quality_gate": lambda: quality_gate(served, safe_report, pf.public),
        "observability": lambda: observability(served, safe_report),
    }
    items: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for key, build in builders.items():
        try:
            items[key] = build()
        except NoteError as exc:
            problems.append(str(exc))
    if problems:
        raise NoteError("\n".join(problems))
    plan = items["capacity_target"].get("plan")
    if plan:  # the plan's strings are the planner's words, filtered like any evidence
        plan["policy"] = pf.measurements(plan.get("policy"))
        if isinstance(plan.get("binding_constraint"), str):
            plan["binding_constraint"] = pf.text(plan["binding_constraint"])
        if isinstance(plan.get("bound"), str):
            plan["bound"] = pf.string(plan["bound"])
        if isinstance(plan.get("sentence"), str):
            plan["sentence"] = pf.text(plan["sentence"])
    return items


def manifest_problems(served: ServedModel, *, capacity_gate_runs: bool) -> list[str]:
    """What a note written after `gate check` would lack that the manifest alone decides, one line per item.

    `gate check --note` asks this before the first gate, so a card without a name costs a second, not the
    gating. The items the check report supplies are left out; so is the capacity target while the capacity
    gate will run (its measurement can supply the rows).
    """
    empty = Evidence()
    builders = {
        "model_identity": lambda: model_identity(served, hash_files=False),  # the files are hashed once, later
        "workload_shape": lambda: workload_shape(served, empty),  # the capacity gate's figures carry no workload
        "observability": lambda: observability(served, None),
    }
    if not capacity_gate_runs:
        builders["capacity_target"] = lambda: capacity_target(served, empty)
    problems = []
    for build in builders.values():
        try:
            build()
        except NoteError as exc:
            problems.append(str(exc))
    return problems


def capacity_gate_bench(report: CheckReport | None) -> BenchEvidence | None:
    """The bench figures the `capacity` gate measured inside `gate check`, read as a bench's (None when it did
    not run)."""
    gate = report.gate("capacity") if report is not None else None
    if gate is None or gate.verdict not in ("pass", "fail") or not isinstance(gate.measurements, CapacityMeasurements):
        return None
    m = gate.measurements
    return as_bench(
        {
            "ttft_ms": m.ttft_ms,
            "tpot_ms": m.tpot_ms,
            "e2el_ms": m.e2el_ms,
            "throughput": m.throughput,
            "goodput": m.goodput,
            "requests": m.requests,
            "peak_memory_bytes": m.peak_memory_bytes,
        },
        "the capacity gate's measurements",
    )


def build_note(served: ServedModel, evidence: Evidence, public_filter: PublicFilter | None = None) -> ServingNote:
    """The serving note for `served` from `evidence`; a NoteError names every item that lacks its source."""
    pf = public_filter or PublicFilter(served)
    safe_report = None
    if evidence.report is not None:
        fingerprint = evidence.report.fingerprint
        if fingerprint != served.fingerprint:
            raise NoteError(
                f"the check report is for fingerprint {str(fingerprint)[:12]}, the manifest's is "
                f"{served.fingerprint[:12]}: rerun `gate check MANIFEST --json check.json` with the same --set options"
            )
        safe_report = pf.report(evidence.report)
    if evidence.bench is None and (measured := capacity_gate_bench(safe_report)) is not None:
        evidence = replace(
            evidence, bench=measured, sources={**evidence.sources, "bench": "gate check (capacity gate)"}
        )
    items = _build_items(served, evidence, safe_report, pf)
    digest, sections = manifest_digests(served)
    now = datetime.now(timezone.utc)
    results_at = evidence.report_at or now
    modified = file_time(served.source) if served.source is not None and served.source.is_file() else None
    warnings = []
    if modified is not None and results_at + CLOCK_SLACK < modified:
        warnings.append(
            f"the gate results ({iso(results_at)}) are older than the manifest ({iso(modified)}): "
            "`gate note --check` will call this note stale until `gate check` is rerun"
        )
    pf.private_texts()  # reads the private suites once; the ones it cannot read are listed in pf.unscanned
    if pf.unscanned:
        warnings.append(f"private suite(s) {', '.join(pf.unscanned)} could not be read for the leak scan")
    return ServingNote(
        name=served.name,
        version=served.version,
        fingerprint=served.fingerprint,
        manifest_sha256=digest,
        section_sha256=sections,
        gate_results_at=results_at.astimezone(timezone.utc).isoformat(),
        written_at=iso(now),
        verdict=items["quality_gate"]["verdict"],
        items=items,
        manifest_modified_at=modified.isoformat() if modified else None,
        warnings=warnings,
    )


def twin_path(note_path: Path) -> Path:
    """The JSON twin written next to a Markdown note (SERVING.md -> SERVING.json)."""
    return note_path.with_suffix(".json")

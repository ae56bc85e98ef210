"""The evidence a serving note is written from: the check report, the bench result and the capacity plan.

Each is the JSON another command writes (`gate check --json`, `gate bench --json`, `gate plan --json`).
They are read here once, checked for the shape the note needs, and given a time: the report's own
`created_at` when it has one, otherwise the file's modification time. All three are read through their types in
servegate.contracts.report (the check report's schema; the parts of the bench and the plan the note uses, in
capacity_evidence), so the note sees typed figures and a file of another shape is refused in one line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from servegate.contracts.errors import ServegateError
from servegate.contracts.report.capacity_evidence import BenchEvidence, PlanEvidence
from servegate.contracts.report.check_report import CheckReport, ReportError, first_problem, report_from_json_data

EvidenceKind = Literal["report", "bench", "plan"]
_Capacity = TypeVar("_Capacity", BenchEvidence, PlanEvidence)

_PRODUCERS: dict[EvidenceKind, str] = {
    "report": "gate check MANIFEST --json check.json",
    "bench": "gate bench MANIFEST --json bench.json",
    "plan": "gate plan MANIFEST --json plan.json",
}
# Keys that tell the three files apart, so a bench file passed as --report is named as such.
_SIGNATURE: dict[EvidenceKind, tuple[str, ...]] = {
    "report": ("verdict", "gates"),
    "bench": ("ttft_ms", "e2el_ms"),
    "plan": ("kv_bytes_per_token", "max_concurrent_sequences"),
}


class NoteError(ServegateError):
    """The note cannot be written or checked: a checklist item lacks its source, or the evidence is unusable."""


def missing(item: str, remedy: str) -> NoteError:
    """The error for a checklist item without a source, naming the manifest field or command that supplies it."""
    return NoteError(f"serving note: {item} is missing: {remedy}")


def producer(kind: EvidenceKind) -> str:
    """The command that writes a piece of evidence."""
    return _PRODUCERS[kind]


def parse_time(value: Any) -> datetime | None:
    """A timestamp from ISO 8601 text or Unix seconds, in UTC; None when absent or unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
    return None


def iso(moment: datetime) -> str:
    """UTC ISO 8601 with seconds, e.g. 2025-01-02T03:04:05+00:00."""
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds")


def file_time(path: Path) -> datetime:
    """A file's modification time in UTC."""
    return datetime.fromtimestamp(os.stat(path).st_mtime, tz=timezone.utc)


def _find(data: dict[str, Any], key: str) -> bool:
    return key in data or any(isinstance(v, dict) and key in v for v in data.values())


def check_shape(kind: EvidenceKind, data: Any, origin: str) -> dict[str, Any]:
    """Return `data` when it looks like `kind`'s JSON; otherwise a NoteError saying what it looks like instead."""
    if not isinstance(data, dict):
        raise NoteError(f"{origin}: expected a JSON object as written by `{producer(kind)}`")
    if all(_find(data, key) for key in _SIGNATURE[kind]):
        return data
    for other, keys in _SIGNATURE.items():
        if other != kind and all(_find(data, key) for key in keys):
            raise NoteError(
                f"{origin}: this is a {other} file (`{producer(other)}`), not a {kind}: pass it as --{other}"
            )
    wanted = ", ".join(_SIGNATURE[kind])
    raise NoteError(f"{origin}: not a {kind} (needs {wanted}); write one with `{producer(kind)}`")


def read_evidence(kind: EvidenceKind, path: Path) -> tuple[dict[str, Any], datetime]:
    """Read one evidence file: its JSON object and when it was produced (created_at, else the file's mtime)."""
    if not path.is_file():
        raise NoteError(f"{path}: no such file; write it with `{producer(kind)}`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NoteError(f"{path}: not valid JSON ({exc}); write it with `{producer(kind)}`") from None
    data = check_shape(kind, data, str(path))
    return data, parse_time(data.get("created_at")) or file_time(path)


def _typed(model: type[_Capacity], data: dict[str, Any], origin: str) -> _Capacity:
    """`data` (already shaped like a bench or a plan) as `model`; a NoteError naming the file and the field
    otherwise."""
    kind: EvidenceKind = "bench" if model is BenchEvidence else "plan"
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise NoteError(
            f"{origin}: not a {kind} in the format `{producer(kind)}` writes ({first_problem(exc)})"
        ) from None


def as_bench(bench: BenchEvidence | dict[str, Any], origin: str = "bench result") -> BenchEvidence:
    """A bench result as its type (a dict is checked for its shape and validated once)."""
    return (
        bench
        if isinstance(bench, BenchEvidence)
        else _typed(BenchEvidence, check_shape("bench", bench, origin), origin)
    )


def as_plan(plan: PlanEvidence | dict[str, Any], origin: str = "capacity plan") -> PlanEvidence:
    """A capacity plan as its type (a dict is checked for its shape and validated once)."""
    return plan if isinstance(plan, PlanEvidence) else _typed(PlanEvidence, check_shape("plan", plan, origin), origin)


def read_check_report(path: Path) -> tuple[CheckReport, datetime]:
    """Read a check report file through its schema, and when its gates ran (created_at, else the file's mtime)."""
    data, _ = read_evidence("report", path)  # names a bench or plan file passed as the report
    try:
        report = report_from_json_data(data, str(path))
    except ReportError as exc:
        raise NoteError(str(exc)) from None
    return report, parse_time(report.created_at) or file_time(path)


def as_check_report(report: CheckReport | dict[str, Any]) -> CheckReport:
    """A report already in memory as the schema's type (a dict is the current format by construction)."""
    if isinstance(report, CheckReport):
        return report
    check_shape("report", report, "check report")
    try:
        return CheckReport.model_validate(report)
    except ValidationError as exc:
        raise NoteError(
            f"check report: not in the shape `{producer('report')}` writes ({first_problem(exc)})"
        ) from None


@dataclass
class Evidence:
    """What was measured about one manifest: any of the check report, bench result and capacity plan."""

    report: CheckReport | None = None
    """`gate check --json` output."""
    bench: BenchEvidence | None = None
    """`gate bench --json` output (the parts the note reads)."""
    plan: PlanEvidence | None = None
    """`gate plan --json` output (the parts the note reads)."""
    report_at: datetime | None = None
    """When the gate results were produced."""
    base_dir: Path | None = None
    """Directory the evidence files sit in (bench plot paths are resolved against it)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Evidence kind -> the name of the file it was read from."""

    @classmethod
    def from_files(cls, report: Path | None = None, bench: Path | None = None, plan: Path | None = None) -> Evidence:
        """Read whichever evidence files are given."""
        out = cls()
        if report is not None:
            out.report, out.report_at = read_check_report(report)
            out.sources["report"] = report.name
        if bench is not None:
            out.bench = _typed(BenchEvidence, read_evidence("bench", bench)[0], str(bench))
            out.sources["bench"] = bench.name
            out.base_dir = bench.resolve().parent
        if plan is not None:
            out.plan = _typed(PlanEvidence, read_evidence("plan", plan)[0], str(plan))
            out.sources["plan"] = plan.name
        return out

    @classmethod
    def from_data(
        cls,
        report: CheckReport | dict[str, Any] | None = None,
        bench: BenchEvidence | dict[str, Any] | None = None,
        plan: PlanEvidence | dict[str, Any] | None = None,
        report_at: datetime | None = None,
    ) -> Evidence:
        """Wrap evidence already in memory (e.g. the report `gate check` just produced; its time defaults to now)."""
        typed = None
        if report is not None:
            typed = as_check_report(report)
            report_at = parse_time(typed.created_at) or report_at or datetime.now(timezone.utc)
        return cls(
            report=typed,
            bench=as_bench(bench) if bench is not None else None,
            plan=as_plan(plan) if plan is not None else None,
            report_at=report_at,
        )

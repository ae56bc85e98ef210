"""What a gate returns and what `gate check` reports: verdicts, measurements and public-safe evidence."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Literal

from servegate.contracts.git_revision import GitBaseline
from servegate.contracts.report.base import VERDICTS as VERDICTS
from servegate.contracts.report.base import Verdict as Verdict
from servegate.contracts.report.check_report import (
    CheckReport,
    GateRecord,
    GitSource,
    ManifestSide,
    measurements_record,
)
from servegate.contracts.report.measurements import Measurements as MeasurementsRecord

_SEVERITY = {"skipped": 0, "pass": 1, "warn": 2, "fail": 3, "unavailable": 4}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe verdict (unavailable > fail > warn > pass > skipped); `skipped` for none."""
    return max(verdicts, key=_SEVERITY.__getitem__, default="skipped")


@dataclass(frozen=True)
class Measurements:
    """What a third-party gate measured: it subclasses this dataclass, one field per number, the unit in the
    field's docstring, and the report keeps its fields as its own keys (`OtherMeasurements`). A built-in gate
    returns its record from servegate.contracts.report instead (`MEASUREMENTS` names it), the type the report
    is written and read through."""

    ran_on: str | None = field(default=None, kw_only=True)
    """Where a remote candidate ran (engine, version, model, URL); absent for the reference runtime."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form in reports, as its report record writes it."""
        return measurements_record("", self).model_dump(mode="json")


AnyMeasurements = MeasurementsRecord | Measurements
"""What a gate may return as its measurements: a built-in gate's report record, or a third party's dataclass."""


def labelled(measurements: AnyMeasurements, ran_on: str) -> AnyMeasurements:
    """The same measurements with `ran_on` (where a remote candidate ran) set."""
    if isinstance(measurements, MeasurementsRecord):
        return measurements.model_copy(update={"ran_on": ran_on})
    return replace(measurements, ran_on=ran_on)


@dataclass
class GateResult:
    """One gate's verdict with the reason, what it measured and public-safe failure examples."""

    name: str
    verdict: Verdict
    reason: str
    """One line a release engineer can act on; the JUnit failure message."""
    measurements: AnyMeasurements = field(default_factory=MeasurementsRecord)
    """What the gate measured (its report record, or a third party's Measurements; the fields' docstrings give
    the units)."""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    """Failure examples: full text only from public suites, otherwise ids and lengths."""
    triggered_by: list[str] = field(default_factory=list)
    """Why the gate ran (changed fields, or `--gate`), or why it was skipped."""
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS} (got {self.verdict!r})")

    def record(self) -> GateRecord:
        """This result as the report holds it."""
        return GateRecord.model_validate(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used in reports."""
        return self.record().model_dump(mode="json")


@dataclass
class GateReport:
    """The outcome of one `gate check`: every planned gate, run or skipped, and the overall verdict."""

    baseline: ManifestSide
    """name, version, fingerprint and form ('reference form' or 'manifest') of what was compared against."""
    candidate: ManifestSide
    """name, version and fingerprint of what is being released."""
    gates: list[GateResult]
    mode: Literal["reference", "change"] = "reference"
    """`reference`: a manifest against its own reference form; `change`: baseline vs candidate manifests."""
    duration_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    """When the gates ran (UTC, ISO 8601); `gate note --check` compares it with the manifest's age."""
    baseline_git: GitBaseline | None = None
    """With `--baseline git:REV[:PATH]`: the commit the baseline was read from and the blob of every file read."""
    time_split: dict[str, dict[str, float]] | None = None
    """Where the check's time went, measured (servegate.gates.time_split): gate, or "setup" for the time outside
    every gate -> kind ("model loads", "reference outputs", ..., "other") -> seconds, rounded to 0.01 s. Printed
    by `gate check --profile-gates`; not part of the `--json` report."""
    processes: dict[str, int] = field(default_factory=dict)
    """Gate -> the process that ran it, for gates a worker of `gate check --jobs` ran beside the check's own
    process (process 1); empty when every gate ran in one. Not part of the `--json` report (its notes say it)."""

    def __post_init__(self) -> None:
        # the sides as their report record (callers may hand plain identities: name, version, fingerprint, ...)
        self.baseline = ManifestSide.model_validate(self.baseline)
        self.candidate = ManifestSide.model_validate(self.candidate)

    @property
    def verdict(self) -> Literal["pass", "fail", "unavailable"]:
        """`fail` when any gate failed, else `unavailable` when a gate could not measure its engine, else `pass`
        (warnings are reported, and fail only with --strict)."""
        if any(g.verdict == "fail" for g in self.gates):
            return "fail"
        return "unavailable" if any(g.verdict == "unavailable" for g in self.gates) else "pass"

    @property
    def warned(self) -> bool:
        """Whether any gate warned."""
        return any(g.verdict == "warn" for g in self.gates)

    def counts(self) -> dict[Verdict, int]:
        """How many gates ended in each verdict."""
        return {v: sum(g.verdict == v for g in self.gates) for v in VERDICTS}

    def to_report(self) -> CheckReport:
        """The report `--json` writes and `gate note` reads (servegate.contracts.report)."""
        return CheckReport(
            verdict=self.verdict,
            fingerprint=self.candidate.fingerprint,
            created_at=self.created_at,
            mode=self.mode,
            baseline=self.baseline,
            baseline_git=GitSource.model_validate(self.baseline_git) if self.baseline_git is not None else None,
            candidate=self.candidate,
            counts=self.counts(),
            duration_s=round(self.duration_s, 3),
            notes=list(self.notes),
            gates=[g.record() for g in self.gates],
        )

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable report written by `--json`, as JSON-ready data."""
        return self.to_report().model_dump(mode="json")


def example(
    item_id: str,
    public: bool,
    *,
    suite: str,
    prompt: str,
    baseline: str | None,
    candidate: str | None,
    reference: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One failure example: the texts when the suite is public, otherwise only the id and the lengths."""
    out: dict[str, Any] = {"suite": suite, "id": item_id}
    if public:
        out.update(prompt=prompt, reference=reference, baseline=baseline, candidate=candidate)
    else:
        out.update(
            prompt_chars=len(prompt),
            baseline_chars=None if baseline is None else len(baseline),
            candidate_chars=None if candidate is None else len(candidate),
        )
    out.update(extra)
    return out

"""The check report (`gate check --json`): every gate's result, the two sides compared, and the format version.

`CheckReport` writes the JSON and reads it back (`read_report`); each gate's measurements are the record its
name selects in `MEASUREMENTS` (a third-party gate's are `OtherMeasurements`). A report of another
`format_version` is refused with one line naming both versions.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    JsonValue,
    SerializeAsAny,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from servegate.contracts.errors import ServegateError
from servegate.contracts.report.base import ReportRecord, Verdict, unmeasured
from servegate.contracts.report.measurements import (
    BatchingMeasurements,
    CachingMeasurements,
    CapacityMeasurements,
    ContractMeasurements,
    LoadMeasurements,
    Measurements,
    OtherMeasurements,
    RemoteIdentity,
)
from servegate.contracts.report.quality_measurements import (
    FallbackMeasurements,
    QualityMeasurements,
    QuantizationMeasurements,
    TruncationMeasurements,
)

REPORT_FORMAT = 1
"""The check report's format version: raised when a key changes meaning or goes; a reader refuses other versions."""

MEASUREMENTS: dict[str, type[Measurements]] = {
    "batching": BatchingMeasurements,
    "caching": CachingMeasurements,
    "capacity": CapacityMeasurements,
    "contract": ContractMeasurements,
    "fallback": FallbackMeasurements,
    "load": LoadMeasurements,
    "quality": QualityMeasurements,
    "quantization": QuantizationMeasurements,
    "truncation": TruncationMeasurements,
}
"""Built-in gate name -> the record of its measurements."""
_BY_CLASS = {kind.__name__: kind for kind in MEASUREMENTS.values()}


class ReportError(ServegateError):
    """A file is not a check report this servegate can read."""


def measurements_record(gate: str, value: Any) -> Measurements:
    """`value` (a gate's measurements object, or their JSON) as the record of gate `gate`.

    Nothing but `ran_on` (a gate skipped, or stopped before measuring): the bare `Measurements`. A gate's own
    object is read by its class's name, so a test gate that borrows a built-in name keeps its own keys.
    """
    if isinstance(value, Measurements):
        return value
    if isinstance(value, dict):
        if set(value) <= {"ran_on"}:
            return Measurements.model_validate(value)
        return MEASUREMENTS.get(gate, OtherMeasurements).model_validate(value)
    if dataclasses.is_dataclass(value) and {f.name for f in dataclasses.fields(value)} <= {"ran_on"}:
        return Measurements(ran_on=getattr(value, "ran_on", None))
    kind = _BY_CLASS.get(type(value).__name__)
    if kind is not None:
        return kind.model_validate(value)
    data = TypeAdapter(type(value)).dump_python(value, mode="json")  # a third party's dataclass, as pydantic writes it
    return OtherMeasurements.model_validate(data)


class FailureExample(ReportRecord):
    """One failure example: the texts when the suite is public, otherwise only the id and the lengths; a gate
    may add keys of its own (an error code, the arrangement it failed in)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue]

    suite: str | None = None
    """The suite the item is from."""
    id: str | int | None = None
    """The item's id."""


class GateRecord(ReportRecord):
    """One gate's verdict with the reason, what it measured, public-safe failure examples and why it ran."""

    name: str
    """The gate's registered name."""
    verdict: Verdict
    """pass, fail, warn, skipped or unavailable."""
    reason: str
    """One line a release engineer can act on; the JUnit failure message."""
    measurements: SerializeAsAny[Measurements] = Measurements()
    """What the gate measured: the record of its name in MEASUREMENTS."""
    evidence: list[FailureExample] = []
    """Failure examples: full text only from public suites, otherwise ids and lengths."""
    triggered_by: list[str] = []
    """Why the gate ran (changed fields, or `--gate`), or why it was skipped."""
    duration_s: float = 0.0
    """Seconds the gate took."""

    @field_validator("measurements", mode="before")
    @classmethod
    def _record_of_the_gate(cls, value: Any, info: ValidationInfo) -> Measurements:
        return measurements_record(str(info.data.get("name", "")), value)


class ManifestSide(ReportRecord):
    """One side of the comparison: which manifest, in which form, and for a remote what it reported."""

    name: str
    """The manifest's name (`deployment` for `gate verify`'s side)."""
    version: str | None = unmeasured()
    """The manifest's version."""
    fingerprint: str | None = unmeasured()
    """The fingerprint of the six elements and the weight checksums (for a remote, with its reported engine)."""
    form: str | None = unmeasured()
    """`reference form` (the manifest's reference form) or `manifest` (as written)."""
    source: str | None = unmeasured()
    """The manifest file ('' for one built in code)."""
    declared_fingerprint: str | None = unmeasured()
    """For a remote: the fingerprint as the manifest declares it, before the reported engine was recorded."""
    remote: RemoteIdentity | None = unmeasured()
    """For a remote: what it reported about itself."""
    url: str | None = unmeasured()
    """For `gate verify`: the deployment's URL."""


class GitSource(ReportRecord):
    """Where a manifest read from git came from: the revision and every file read."""

    spec: str
    """The argument as given, e.g. `git:origin/main`."""
    revision: str
    """The revision as given, e.g. `origin/main`."""
    commit: str
    """The full sha of the commit the revision named when it was read."""
    path: str
    """The manifest's path relative to the repository root."""
    blobs: dict[str, str]
    """Repository-relative path -> git blob sha, for every file read from the commit."""
    working_tree: list[str] = []
    """Named paths absent at the commit but present in the working tree, read there."""
    outside_repository: list[str] = []
    """Named paths outside the repository, read where they are (absolute)."""


class CheckReport(ReportRecord):
    """The outcome of one `gate check`, as `--json` writes it and `gate note` reads it."""

    format_version: int = REPORT_FORMAT
    """The report's format (REPORT_FORMAT when written)."""
    verdict: Literal["pass", "fail", "unavailable"]
    """`fail` when any gate failed, else `unavailable` when a gate could not measure its engine, else `pass`."""
    fingerprint: str | None
    """The candidate's fingerprint."""
    created_at: str
    """When the gates ran (UTC, ISO 8601); `gate note --check` compares it with the manifest's age."""
    mode: Literal["reference", "change"] = "reference"
    """`reference`: a manifest against its own reference form; `change`: baseline vs candidate manifests."""
    baseline: ManifestSide
    """What was compared against."""
    baseline_git: GitSource | None = None
    """With `--baseline git:REV[:PATH]`: the commit the baseline was read from and the blob of every file read."""
    candidate: ManifestSide
    """What is being released."""
    counts: dict[Verdict, int]
    """How many gates ended in each verdict."""
    duration_s: float
    """Seconds the whole check took."""
    notes: list[str] = []
    """What the check said beside the gates (e.g. an engine it could not start)."""
    gates: list[GateRecord]
    """Every planned gate, run or skipped."""

    @field_validator("format_version", mode="before")
    @classmethod
    def _this_format(cls, value: Any) -> Any:
        if value != REPORT_FORMAT:
            raise ValueError(format_refusal(value))
        return value

    def to_json(self) -> str:
        """The JSON text `--json` writes (two-space indent, a final newline)."""
        return self.model_dump_json(indent=2) + "\n"

    def gate(self, name: str) -> GateRecord | None:
        """The result of the gate called `name`, if it is in the report."""
        return next((g for g in self.gates if g.name == name), None)


def format_refusal(version: Any) -> str:
    """Why a report of format `version` is not read (format 0: written before the report had a version)."""
    return (
        f"a check report of format {version!r}; this servegate reads format {REPORT_FORMAT} only: rerun "
        "`gate check MANIFEST --json check.json` to write one"
    )


def read_report(text: str | bytes, origin: str = "check report") -> CheckReport:
    """Read a check report's JSON; a ReportError in one line when it is not one this servegate reads.

    A report written before format_version existed (format 0) is refused like any other version.
    """
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{origin}: not valid JSON ({exc})") from None
    return report_from_json_data(data, origin)


def report_from_json_data(data: Any, origin: str = "check report") -> CheckReport:
    """A check report from its parsed JSON (`read_report` without the parsing); the same one-line refusals."""
    if isinstance(data, dict) and "gates" in data and data.get("format_version", 0) != REPORT_FORMAT:
        raise ReportError(f"{origin}: {format_refusal(data.get('format_version', 0))}")
    try:
        return CheckReport.model_validate(data)
    except ValidationError as exc:
        raise ReportError(f"{origin}: not a check report of format {REPORT_FORMAT} ({first_problem(exc)})") from None


def first_problem(exc: ValidationError) -> str:
    """The first thing wrong with a report, on one line: where (dotted path) and what."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "the top level"
    return f"{where}: {first['msg']}"

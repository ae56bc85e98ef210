"""What a gate returns and what `gate check` reports: verdicts, measurements and public-safe evidence."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from datetime import datetime, timezone
from typing import Any, Literal

from servegate.contracts.git_revision import GitBaseline

Verdict = Literal["pass", "fail", "warn", "skipped", "unavailable"]
VERDICTS: tuple[Verdict, ...] = ("pass", "fail", "warn", "skipped", "unavailable")
"""`unavailable`: the engine the gate needed could not be reached or failed too many requests; nothing was
measured, and it blocks like a failure (exit 2: a broken deployment is not an inferior model)."""

_SEVERITY = {"skipped": 0, "pass": 1, "warn": 2, "fail": 3, "unavailable": 4}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe verdict (unavailable > fail > warn > pass > skipped); `skipped` for none."""
    return max(verdicts, key=_SEVERITY.__getitem__, default="skipped")


OPTIONAL: dict[str, bool] = {"omit_if_none": True}
"""Field metadata: a measurement only some runs make, left out of the report when it was not made."""
FLATTEN: dict[str, bool] = {"flatten": True}
"""Field metadata: a mapping whose keys go into the report beside the other fields (e.g. one per metric)."""


def to_json(value: Any) -> Any:
    """A measured value as JSON-ready data: objects by their `to_dict`, containers element by element."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, type):
        return to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return fields_to_json(value)
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    return value


def fields_to_json(record: Any) -> dict[str, Any]:
    """A dataclass as the report writes it: one key per field in order, OPTIONAL ones only when set."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if value is None and f.metadata.get("omit_if_none"):
            continue
        if f.metadata.get("flatten"):
            out.update(to_json(value))
        else:
            out[f.name] = to_json(value)
    return out


@dataclass(frozen=True)
class Measurements:
    """What a gate measured. Each gate subclasses it beside its own code, one field per number, the unit in
    the field's docstring; the report's JSON keys are the field names (`to_dict`)."""

    ran_on: str | None = field(default=None, kw_only=True, metadata=OPTIONAL)
    """Where a remote candidate ran (engine, version, model, URL); absent for the reference runtime."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form in reports (`ran_on` last, as the remote label is added after the gate ran)."""
        out = fields_to_json(self)
        if "ran_on" in out:
            out["ran_on"] = out.pop("ran_on")
        return out


@dataclass
class GateResult:
    """One gate's verdict with the reason, what it measured and public-safe failure examples."""

    name: str
    verdict: Verdict
    reason: str
    """One line a release engineer can act on; the JUnit failure message."""
    measurements: Measurements = field(default_factory=Measurements)
    """What the gate measured (the gate's own Measurements type; its fields' docstrings give the units)."""
    evidence: list[dict[str, Any]] = field(default_factory=list)
    """Failure examples: full text only from public suites, otherwise ids and lengths."""
    triggered_by: list[str] = field(default_factory=list)
    """Why the gate ran (changed fields, or `--gate`), or why it was skipped."""
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS} (got {self.verdict!r})")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used in reports."""
        data = asdict(replace(self, measurements=Measurements()))
        data["measurements"] = self.measurements.to_dict()
        return data


@dataclass
class GateReport:
    """The outcome of one `gate check`: every planned gate, run or skipped, and the overall verdict."""

    baseline: dict[str, Any]
    """name, version, fingerprint and form ('reference' or 'manifest') of what was compared against."""
    candidate: dict[str, Any]
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

    def counts(self) -> dict[str, int]:
        """How many gates ended in each verdict."""
        return {v: sum(g.verdict == v for g in self.gates) for v in VERDICTS}

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable report written by `--json`."""
        return {
            "verdict": self.verdict,
            "fingerprint": self.candidate.get("fingerprint"),
            "created_at": self.created_at,
            "mode": self.mode,
            "baseline": self.baseline,
            "baseline_git": self.baseline_git.to_dict() if self.baseline_git is not None else None,
            "candidate": self.candidate,
            "counts": self.counts(),
            "duration_s": round(self.duration_s, 3),
            "notes": list(self.notes),
            "gates": [g.to_dict() for g in self.gates],
        }


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

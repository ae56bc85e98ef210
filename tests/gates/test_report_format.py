"""The check report's schema (servegate.contracts.report): a golden report per format version reads back to the
same text, every built-in gate's measurements are read as their typed record, and other versions are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servegate.contracts.report.check_report import (
    MEASUREMENTS,
    REPORT_FORMAT,
    CheckReport,
    ReportError,
    read_report,
)
from servegate.contracts.report.measurements import Measurements, OtherMeasurements
from servegate.gates.reports import json_text
from servegate.gates.result import GateReport, GateResult

GOLDEN = Path(__file__).parent / "golden"


def golden(version: int = REPORT_FORMAT) -> str:
    """The golden report of a format version, as `gate check` wrote it on the quickstart with every built-in gate
    forced (`gate check examples/quickstart/manifest.yaml --gate contract --gate quantization ... --gate capacity
    --json`), the manifest's absolute path then made relative. A new format version adds its own file."""
    return (GOLDEN / f"report-v{version}.json").read_text(encoding="utf-8")


def test_there_is_a_golden_report_for_the_current_format() -> None:
    assert json.loads(golden())["format_version"] == REPORT_FORMAT


def test_the_golden_report_reads_back_to_the_same_text() -> None:
    text = golden()
    assert read_report(text).to_json() == text


def test_each_gate_of_the_golden_report_is_read_as_its_own_record() -> None:
    report = read_report(golden())
    measured = [g for g in report.gates if g.verdict not in ("skipped", "unavailable")]
    assert {g.name for g in measured} == set(MEASUREMENTS)  # every built-in gate, each with its measurements
    for gate in measured:
        assert type(gate.measurements) is MEASUREMENTS[gate.name], gate.name
    quality = report.gate("quality")
    assert quality is not None
    suites = quality.measurements.suites  # type: ignore[attr-defined]
    assert suites and all(scores.metrics for scores in suites.values())


@pytest.mark.parametrize("version", [None, 0, REPORT_FORMAT + 1])
def test_a_report_of_another_format_is_refused_in_one_line(version: int | None) -> None:
    data = json.loads(golden())
    if version is None:  # written before the report had a format_version
        del data["format_version"]
    else:
        data["format_version"] = version
    with pytest.raises(ReportError) as raised:
        read_report(json.dumps(data), "old.json")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"old.json: a check report of format {version or 0}; this servegate reads format 1")
    assert "gate check MANIFEST --json check.json" in message


def test_a_report_with_a_key_the_schema_does_not_know_is_refused_naming_it() -> None:
    data = json.loads(golden())
    gate = next(g for g in data["gates"] if g["name"] == "batching")
    gate["measurements"]["mismatch_fraction"] = 0.0
    with pytest.raises(ReportError, match=r"gates\.\d+\.measurements\.mismatch_fraction: Extra inputs"):
        read_report(json.dumps(data), "check.json")


def test_a_written_report_reads_back_through_the_same_types() -> None:
    from servegate.gates.checks.caching import CachingMeasurements

    side = {"name": "m", "version": "1", "fingerprint": "f" * 64, "form": "manifest"}
    measured = CachingMeasurements(caches=["prefix cache"], tenants_identified=False, shared_across_tenants=[])
    report = GateReport(
        baseline=side,
        candidate=side,
        gates=[
            GateResult("caching", "pass", "ok", measured, triggered_by=["--gate"]),
            GateResult("batching", "skipped", "no watched field changed"),
        ],
    )
    text = json_text(report)
    back = read_report(text)
    assert back.to_json() == text and back == CheckReport.model_validate_json(text)
    assert type(back.gates[0].measurements).__name__ == "CachingMeasurements"
    assert type(back.gates[1].measurements) is Measurements  # nothing measured: no keys


def test_a_third_party_gates_measurements_keep_their_own_keys() -> None:
    from dataclasses import dataclass

    from servegate.gates.result import Measurements as GateMeasurements

    @dataclass(frozen=True)
    class Probe(GateMeasurements):
        hits: int = 0
        """Hits (hits)."""

    side = {"name": "m", "fingerprint": "f" * 64}
    report = GateReport(baseline=side, candidate=side, gates=[GateResult("acme", "pass", "ok", Probe(hits=3))])
    back = read_report(json_text(report))
    assert isinstance(back.gates[0].measurements, OtherMeasurements)
    assert back.gates[0].measurements.model_dump() == {"hits": 3}

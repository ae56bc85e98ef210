"""Each built-in gate's measurements are its report record (servegate.contracts.report): one type builds them,
writes them and reads them back, every field saying its unit."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys

from pydantic import BaseModel

import servegate.contracts.report as report_package
import servegate.gates as gates_package
from servegate.contracts.report import quality as records
from servegate.contracts.report.base import ReportRecord
from servegate.contracts.report.check_report import MEASUREMENTS
from servegate.contracts.report.measurements import CachingMeasurements
from servegate.contracts.report.probes import TimingAudits
from servegate.gates import check  # noqa: F401 - registers every built-in gate
from servegate.gates.quality.statistics import paired_noninferiority
from servegate.gates.registry import GATES
from servegate.gates.result import GateResult, Measurements, labelled


def _modules(package: object) -> list[object]:
    path, prefix = package.__path__, package.__name__ + "."  # type: ignore[attr-defined]
    return [importlib.import_module(m.name) for m in pkgutil.walk_packages(path, prefix)]


def _records() -> dict[str, type[ReportRecord]]:
    """Every record class of the report schema, by name."""
    out: dict[str, type[ReportRecord]] = {}
    for module in _modules(report_package):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, ReportRecord) and value.__module__ == module.__name__:
                out[value.__name__] = value
    return out


def test_each_built_in_gate_builds_the_record_its_report_reads() -> None:
    """The module of each built-in gate names the schema's own class, not a copy of it."""
    assert set(MEASUREMENTS) <= set(GATES.names())
    for gate, record in MEASUREMENTS.items():
        module = sys.modules[GATES.get(gate).__module__]
        assert getattr(module, record.__name__) is record, gate


def test_no_gate_module_keeps_its_own_copy_of_a_report_record() -> None:
    """A dataclass (or model) in servegate.gates named like a record would be the duplicate this schema replaced."""
    records_by_name = _records()
    del records_by_name["Measurements"]  # gates.result.Measurements: the base of a third party's dataclass
    copies = []
    for module in _modules(gates_package):
        for name, value in vars(module).items():
            own = isinstance(value, type) and value.__module__ == module.__name__
            if own and name in records_by_name and (dataclasses.is_dataclass(value) or issubclass(value, BaseModel)):
                copies.append(f"{module.__name__}.{name}")
    assert not copies


def test_every_record_is_frozen_and_documents_each_field() -> None:
    for name, record in _records().items():
        assert record.model_config.get("frozen"), name
        undocumented = [f for f, info in record.model_fields.items() if not info.description]
        assert not undocumented, (name, undocumented)


def test_report_keys_are_the_field_names_with_unmeasured_optional_ones_left_out() -> None:
    partial = CachingMeasurements(caches=[], tenants_identified=False, shared_across_tenants=[])
    assert partial.model_dump(mode="json") == {"caches": [], "tenants_identified": False, "shared_across_tenants": []}
    probed = labelled(partial.updated(probes=3, tenant_b_extra_hits=0), "vllm 0.32.0 serving m")
    assert list(probed.model_dump(mode="json")) == ["caches", "tenants_identified", "shared_across_tenants", "probes",
                                                    "tenant_b_extra_hits", "ran_on"]  # fmt: skip
    assert GateResult("caching", "pass", "ok").to_dict()["measurements"] == {}


def test_an_update_is_validated_like_a_new_record() -> None:
    """`updated` turns what a gate hands it into records; a wrong key or type fails there, not in the report."""
    partial = CachingMeasurements(caches=[], tenants_identified=False, shared_across_tenants=[])
    audits = partial.updated(timing_audits={"response_cache": None, "isolation": None, "not_run": ["off"]})
    assert isinstance(audits.timing_audits, TimingAudits) and audits.timing_audits.not_run == ("off",)
    for bad in ({"probes": "three"}, {"warm_hits": 1}):
        try:
            partial.updated(**bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")


def test_a_third_party_gate_keeps_its_own_dataclass() -> None:
    @dataclasses.dataclass(frozen=True)
    class Hits(Measurements):
        hits: int = 0
        """Hits (hits)."""

    assert labelled(Hits(hits=2), "remote").to_dict() == {"hits": 2, "ran_on": "remote"}


def test_nested_records_serialise_as_the_report_reads_them() -> None:
    test = paired_noninferiority([1, 1, 0, 1], [1, 1, 0, 0], margin=0.5, confidence=0.9, metric="exact_match")
    suite = records.SuiteScores(items=4, baseline_from_cache=False, candidate_errors=0, metrics={"exact_match": test})
    written = suite.model_dump(mode="json")
    assert written == {"items": 4, "baseline_from_cache": False, "candidate_errors": 0,
                       "exact_match": test.to_dict()}  # fmt: skip
    assert records.SuiteScores.model_validate(written) == suite

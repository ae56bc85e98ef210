"""Each gate's measurements: a frozen dataclass, every field saying its unit, serialised to the report's keys."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

from servegate.gates import check  # noqa: F401 - registers every built-in gate
from servegate.gates.checks.batching import BatchingMeasurements
from servegate.gates.checks.caching import CachingMeasurements
from servegate.gates.quality.comparison import SuiteScores
from servegate.gates.quality.statistics import paired_noninferiority
from servegate.gates.result import GateResult, Measurements, to_json


def _all_subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


def _undocumented(cls: type) -> list[str]:
    """Fields declared in `cls`'s own body with no docstring right below them."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    missing = []
    for node, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign):
            documented = isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant)
            if not documented:
                missing.append(node.target.id)  # type: ignore[attr-defined]
    return missing


def test_every_gates_measurements_are_frozen_and_document_each_field() -> None:
    kinds = [k for k in _all_subclasses(Measurements) if k.__module__.startswith("servegate.")]
    assert {"BatchingMeasurements", "CachingMeasurements", "CapacityMeasurements", "ContractMeasurements",
            "FallbackMeasurements", "QualityMeasurements", "QuantizationMeasurements",
            "TruncationMeasurements"} <= {k.__name__ for k in kinds}  # fmt: skip
    for kind in [*kinds, SuiteScores]:
        assert kind.__dataclass_params__.frozen, kind.__name__  # type: ignore[attr-defined]
        assert not _undocumented(kind), (kind.__name__, _undocumented(kind))


def test_report_keys_are_the_field_names_with_unmeasured_optional_ones_left_out() -> None:
    partial = CachingMeasurements(caches=[], tenants_identified=False, shared_across_tenants=[])
    assert partial.to_dict() == {"caches": [], "tenants_identified": False, "shared_across_tenants": []}
    probed = dataclasses.replace(partial, probes=3, tenant_b_extra_hits=0, ran_on="vllm 0.32.0 serving m")
    assert list(probed.to_dict()) == ["caches", "tenants_identified", "shared_across_tenants", "probes",
                                      "tenant_b_extra_hits", "ran_on"]  # fmt: skip
    assert GateResult("caching", "pass", "ok").to_dict()["measurements"] == {}


def test_nested_records_serialise_as_the_report_reads_them() -> None:
    test = paired_noninferiority([1, 1, 0, 1], [1, 1, 0, 0], margin=0.5, confidence=0.9, metric="exact_match")
    suite = SuiteScores(items=4, baseline_from_cache=False, candidate_errors=0, metrics={"exact_match": test})
    assert to_json(suite) == {"items": 4, "baseline_from_cache": False, "candidate_errors": 0,
                               "exact_match": test.to_dict()}  # fmt: skip
    batching = BatchingMeasurements("continuous", 4, 2, ["one at a time"], 4, 1, 0.25, "deadline_exceeded", 0)
    assert batching.to_dict()["mismatch_rate"] == 0.25 and "ran_on" not in batching.to_dict()

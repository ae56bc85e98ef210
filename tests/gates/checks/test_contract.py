"""The contract gate drives the real HTTP app in process: a server keeping the contract passes, a drifted one fails."""

from __future__ import annotations

import pytest
from support.oracle_engine import gate_result

from servegate.contracts.errors import CATALOGUE
from servegate.gates.checks.contract import ContractGate
from servegate.gates.probes.contract_probes import NOT_PROVOKABLE, probes_for
from servegate.server import create_app


def test_every_catalogued_error_has_a_probe_or_a_stated_reason(load) -> None:  # noqa: ANN001
    for name in ("base.yaml", "reject.yaml"):
        covered = {p.code for p in probes_for(load(name))} | set(NOT_PROVOKABLE)
        assert covered == set(CATALOGUE)


def test_probe_expectations_follow_the_manifest(load) -> None:  # noqa: ANN001
    left = {p.code: p for p in probes_for(load("base.yaml"))}
    reject = {p.code: p for p in probes_for(load("reject.yaml"))}
    assert left["input_too_long"].status == 200  # truncation: left answers
    assert reject["input_too_long"].status == 400 and reject["input_too_long"].expect_code == "input_too_long"
    assert left["overloaded"].status == 200  # the fallback takes overload
    no_fallback = load("base.yaml", "failure_policy.fallback=null")
    overload = {p.code: p for p in probes_for(no_fallback)}["overloaded"]
    assert (overload.status, overload.expect_code, overload.expect_header) == (429, "overloaded", "retry-after")


def test_a_kept_contract_passes_all_it_can_measure(load, check, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(ContractGate, "app_factory", staticmethod(create_app))
    result = gate_result(check(load("reject.yaml"), gates=("contract",)), "contract")
    # the oracle engine answers alike at every temperature: the seed cannot be measured, and the gate says so
    assert result.verdict == "warn", result.reason
    assert [n.split(":")[0] for n in result.measurements.not_verified] == ["seed"]
    assert set(result.measurements.codes_provoked) == set(CATALOGUE) - set(NOT_PROVOKABLE)


def test_a_server_drifted_from_its_manifest_fails(load, check, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    def drifted(served, engine):  # noqa: ANN001, ANN202 - the deployed config ignores unknown fields
        pre = {**served.preprocess.model_dump(mode="python"), "unknown_fields": "ignore"}
        return create_app(served.with_changes(preprocess=pre), engine)

    monkeypatch.setattr(ContractGate, "app_factory", staticmethod(drifted))
    result = gate_result(check(load("reject.yaml"), gates=("contract",)), "contract")
    assert result.verdict == "fail"
    assert result.reason.startswith("unknown_parameter:") and "expected 400 unknown_parameter" in result.reason

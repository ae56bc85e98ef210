"""Checklist item 6: the quality gate, read from a check report that has already been made public-safe.

The report is read through its schema (servegate.contracts.report): each gate's paired tests are its suites'
`SuiteScores` (the fallback's are its output `contract`, the load gate's its paired tests under load), the
next-token divergence is `next_token`, and only the quantization gate says whether its scheme was simulated.
"""

from __future__ import annotations

from typing import Any

from servegate.contracts.diff import diff_manifests
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.check_report import CheckReport, GateRecord
from servegate.contracts.report.measurements import LoadMeasurements
from servegate.contracts.report.quality import NextTokenSuite, PairedTest
from servegate.contracts.report.quality_measurements import (
    QualityMeasurements,
    QuantizationMeasurements,
)
from servegate.model_cards.evidence import missing, producer
from servegate.model_cards.items_audits import output_length_rows, suite_scores
from servegate.model_cards.items_load import load_checks


def paired_tests(gate: GateRecord) -> list[tuple[str, PairedTest]]:
    """(suite, test) for every paired test the gate reports: its suites', or the load gate's under load."""
    m = gate.measurements
    if isinstance(m, LoadMeasurements):
        return [(t.suite, t) for t in m.quality.tests]
    return [(suite, test) for suite, scores in suite_scores(gate).items() for test in scores.metrics.values()]


def score_rows(gate: GateRecord) -> list[dict[str, Any]]:
    """Per suite and metric: n, both scores, the difference, its bounds, the margin and the verdict."""
    return [
        {
            "gate": gate.name,
            "suite": suite,
            "metric": test.metric,
            "n": float(test.n),
            "baseline": test.baseline_score,
            "candidate": test.candidate_score,
            "difference": test.difference,
            "ci_low": test.lower,
            "ci_high": test.upper,
            "confidence": test.confidence,
            "margin": test.margin,
            "verdict": test.verdict,
        }
        for suite, test in paired_tests(gate)
    ]


def _next_token(gate: GateRecord) -> dict[str, NextTokenSuite]:
    m = gate.measurements
    found = m.next_token if isinstance(m, QualityMeasurements | QuantizationMeasurements) else None
    return found if isinstance(found, dict) else {}


def agreement_rows(gate: GateRecord) -> list[dict[str, Any]]:
    """Per suite: top-1 token agreement and mean KL between baseline and candidate next-token distributions."""
    return [
        {"gate": gate.name, "suite": suite, "token_agreement": d.token_agreement, "mean_kl": d.mean_kl_nats}
        for suite, d in _next_token(gate).items()
    ]


def simulated(gate: GateRecord) -> bool | None:
    """True when the gate reports a simulated optimization, False when it says not, None when it does not say."""
    m = gate.measurements
    return m.simulated if isinstance(m, QuantizationMeasurements) else None


def optimizations(served: ServedModel, gates: list[GateRecord]) -> list[dict[str, Any]]:
    """Every field where the served model differs from its reference form, the gates watching it, and whether
    the gate that measured it says it was simulated."""
    by_name = {g.name: g for g in gates}
    rows = []
    for change in diff_manifests(served.reference_form(), served):
        watching = [g for g in change.gates if g in by_name]
        flags = [simulated(by_name[g]) for g in watching]
        rows.append(
            {
                "field": change.path,
                "reference": change.old,
                "served": change.new,
                "gates": list(change.gates),
                "verdicts": {g: by_name[g].verdict for g in watching},
                "simulated": True if True in flags else (False if False in flags else None),
            }
        )
    return rows


def quality_gate(served: ServedModel, report: CheckReport | None, public_suites: set[str]) -> dict[str, Any]:
    """Item 6: each gate's verdict, metrics with intervals and margins, failure-example counts, simulated parts.

    `report` must already be public-safe (PublicFilter.report); only public failure examples are listed.
    """
    if report is None:
        raise missing("quality gate", f"run `{producer('report')}` and pass --report check.json")
    if not report.gates:
        raise missing("quality gate", f"the check report has no gates: rerun `{producer('report')}`")
    gates, scores, agreement, examples = [], [], [], []
    for gate in report.gates:
        public = [e for e in gate.evidence if e.suite in public_suites]
        gates.append(
            {
                "name": gate.name,
                "verdict": gate.verdict,
                "reason": gate.reason,
                "failure_examples": len(gate.evidence),
                "public_failure_examples": len(public),
                "simulated": simulated(gate),
            }
        )
        scores += score_rows(gate)
        agreement += agreement_rows(gate)
        examples += [
            {"gate": gate.name, **e.model_dump(mode="json")} for e in public[: served.quality.max_failure_examples]
        ]
    return {
        "verdict": report.verdict if report.verdict in ("pass", "fail") else "?",
        "mode": report.mode,
        "confidence": served.quality.confidence,
        "margins": {**{"default": served.quality.default_margin}, **served.quality.margins},
        "gates": gates,
        "scores": scores,
        "agreement": agreement,
        "output_length": output_length_rows(report.gates),
        "optimizations": optimizations(served, report.gates),
        "examples": examples,
        "under_load": load_checks(report),
    }

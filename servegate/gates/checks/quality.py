"""The `quality` gate: a change to the weights (or anything else that changes outputs) must stay non-inferior."""

from __future__ import annotations

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.report.quality_measurements import QualityMeasurements
from servegate.gates.base import Gate, GateContext
from servegate.gates.quality.comparison import compare_on_suites
from servegate.gates.quality.divergence import next_token_report
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult


@register_gate(
    "quality",
    watches=GATE_WATCHES["quality"],
    beside_others=True,
    shares="evaluation baseline",
    purpose="New weights, templates or backends keep every suite metric within its non-inferiority margin.",
)
class QualityGate(Gate):
    """Paired non-inferiority of the candidate against the baseline on every declared suite and metric."""

    def run(self, ctx: GateContext) -> GateResult:
        """Compare the baseline with the changed fields taken from the candidate (all of it when forced)."""
        paths = [p for p in ctx.changed_paths if not p.startswith(("quality", "capacity", "card"))]
        if not ctx.candidate.quality.suites:
            return self.result("warn", "no eval suites declared (quality.suites): quality cannot be compared")
        if not paths and not ctx.forced:
            return self.result("pass", "only quality settings changed: no served behaviour to compare")
        candidate = ctx.isolated(paths) if paths else ctx.candidate
        comparison = compare_on_suites(ctx, ctx.baseline, candidate)
        measurements = QualityMeasurements(
            compared_fields=paths or ["(whole candidate)"],
            suites=comparison.suite_scores(),
            next_token=next_token_report(ctx, candidate),
        )
        return self.result(comparison.verdict, comparison.reason(), measurements, comparison.evidence)

"""Declared targets against a prediction or a measurement: one check per latency percentile, throughput and memory.

The planner checks each candidate policy's prediction with them; the capacity gates check what a bench measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servegate.contracts.capacity_section import Targets
from servegate.contracts.units import format_bytes

_LATENCY_KEYS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2el_ms"}


@dataclass
class TargetCheck:
    """One declared target against its prediction."""

    name: str
    """e.g. `e2e_ms.p99`, `throughput.requests/s`, `memory`."""
    target: float
    predicted: float
    unit: str
    upper: bool = True
    """True when the target is a ceiling (latency, memory), False for a floor (throughput)."""

    @property
    def ratio(self) -> float:
        """predicted / target for ceilings, target / predicted for floors: > 1 means missed."""
        if self.upper:
            return self.predicted / self.target
        return self.target / self.predicted if self.predicted > 0 else float("inf")

    @property
    def met(self) -> bool:
        """Whether the target holds."""
        return self.ratio <= 1.0

    def as_dict(self) -> dict[str, Any]:
        """JSON form with the miss spelled out."""
        miss = self.predicted - self.target if self.upper else self.target - self.predicted
        return {
            "name": self.name,
            "target": self.target,
            "predicted": self.predicted,
            "unit": self.unit,
            "met": self.met,
            "missed_by": max(0.0, miss),
            "missed_by_pct": max(0.0, 100.0 * (self.ratio - 1.0)),
        }

    def sentence(self) -> str:
        """One line a human reads."""
        kind = "at most" if self.upper else "at least"

        def show(x: float) -> str:
            return format_bytes(x) if self.unit == "bytes" else f"{x:.4g} {self.unit}"

        verdict = "met" if self.met else f"MISSED by {show(abs(self.predicted - self.target))}"
        return f"{self.name}: predicted {show(self.predicted)}, target {kind} {show(self.target)} ({verdict})"


def check_targets(targets: Targets | None, summary: dict[str, Any], memory_bytes: float | None) -> list[TargetCheck]:
    """Each declared target against a predicted (or measured) summary; the memory target against `memory_bytes`
    (a plan's total or a measured peak; None: the memory target is not checked)."""
    checks: list[TargetCheck] = []
    if targets is None:
        return checks
    for field_name, key in _LATENCY_KEYS.items():
        pct = getattr(targets, field_name)
        if pct is None:
            continue
        for p in ("p50", "p95", "p99"):
            value = getattr(pct, p)
            if value is not None:
                checks.append(TargetCheck(f"{field_name}.{p}", value, float(summary[key][p]), "ms"))
    if targets.throughput is not None:
        unit = targets.throughput.unit
        got = summary["throughput"]["requests_per_s" if unit == "requests/s" else "output_tokens_per_s"]
        checks.append(TargetCheck(f"throughput.{unit}", targets.throughput.value, float(got), unit, upper=False))
    if targets.memory is not None and memory_bytes is not None:
        checks.append(TargetCheck("memory", float(targets.memory), float(memory_bytes), "bytes"))
    return checks

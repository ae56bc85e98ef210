"""The `quantization` gate: quantized weights, lower precision or an fp8 KV cache must stay non-inferior."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.manifest import ServedModel
from servegate.gates.base import Gate, GateContext
from servegate.gates.comparison import SuiteScores, compare_on_suites
from servegate.gates.divergence import next_token_report
from servegate.gates.registry import register_gate
from servegate.gates.result import OPTIONAL, GateResult, Measurements

PRECISION_FIELDS = ("runtime.quantization", "runtime.dtype", "weights.dtype", "runtime.kv_cache.dtype")
SIMULATED = frozenset({"int2-weight", "int3-weight"})
"""Schemes the runtime simulates by round-tripping weights (labelled as such in every report)."""


@dataclass(frozen=True)
class QuantizationMeasurements(Measurements):
    """The candidate's precision settings and, when suites are declared, each suite's paired tests."""

    method: str
    """runtime.quantization.method (e.g. none, int8-weight, int4-weight)."""
    simulated: bool
    """Whether the runtime simulates the scheme by round-tripping weights instead of running it."""
    group_size: int | None
    """Weights per quantization group (weights); None for schemes without groups."""
    dtype: str
    """runtime.dtype: the activations' and unquantized weights' precision."""
    kv_cache_dtype: str | None
    """runtime.kv_cache.dtype; None without a paged KV cache."""
    calibration: dict[str, Any] | None
    """The calibration suite's name, split, item count and sha256 of its items; None when undeclared."""
    suites: dict[str, SuiteScores] | None = field(default=None, metadata=OPTIONAL)
    """Suite name -> its items and per-metric paired tests."""
    next_token: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    """Suite name -> next-token agreement (fraction) and KL divergence (nats), or {"unavailable": why}."""


def calibration_identity(served: ServedModel) -> dict[str, Any] | None:
    """The calibration suite a quantized manifest declares, with a hash of its items (None when undeclared)."""
    name = served.runtime.quantization.calibration
    if name is None:
        return None
    identity: dict[str, Any] = {"suite": name, "split": "calibration"}
    try:
        from servegate.zoo.eval_suites import load_suite

        source = name if name.startswith(("zoo:", "hf:")) else str(served.resolve_path(name))
        rows = load_suite(source, "calibration")
        identity["items"] = len(rows)
        identity["sha256"] = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    except Exception as exc:  # recorded, not fatal: the calibration suite is evidence, not a check
        identity["error"] = f"cannot be loaded: {exc}"
    return identity


@register_gate(
    "quantization",
    watches=GATE_WATCHES["quantization"],
    purpose="Quantized or lower-precision weights keep every suite metric within its non-inferiority margin.",
)
class QuantizationGate(Gate):
    """Paired non-inferiority per suite, token agreement and mean KL, calibration identity, failure examples."""

    def run(self, ctx: GateContext) -> GateResult:
        """Compare the baseline with only its precision fields taken from the candidate."""
        candidate = ctx.isolated(PRECISION_FIELDS)
        quant = candidate.runtime.quantization
        measurements = QuantizationMeasurements(
            method=quant.method,
            simulated=quant.method in SIMULATED,
            group_size=quant.group_size if quant.method not in ("none", "int8-weight", "int8-dynamic") else None,
            dtype=candidate.runtime.dtype,
            kv_cache_dtype=candidate.runtime.kv_cache.dtype if candidate.runtime.kv_cache else None,
            calibration=calibration_identity(candidate),
        )
        if not ctx.candidate.quality.suites:
            return self.result(
                "warn", "no eval suites declared (quality.suites): quantization cannot be judged", measurements
            )
        comparison = compare_on_suites(ctx, ctx.baseline, candidate)
        measurements = replace(
            measurements, suites=comparison.suite_scores(), next_token=next_token_report(ctx, candidate)
        )
        reason = comparison.reason()
        if measurements.simulated:
            reason = f"{reason} ({quant.method} simulated)"
        return self.result(comparison.verdict, reason, measurements, comparison.evidence)

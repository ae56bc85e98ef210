"""The `quantization` gate: quantized weights, lower precision or an fp8 KV cache must stay non-inferior."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.quality_measurements import CheckpointScheme, QuantizationMeasurements
from servegate.gates.base import Gate, GateContext
from servegate.gates.quality.comparison import compare_on_suites
from servegate.gates.quality.divergence import next_token_report
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult
from servegate.runtime.model.weights import served_scheme

PRECISION_FIELDS: tuple[str, ...] = ("runtime.quantization", "runtime.dtype", "weights.dtype", "runtime.kv_cache.dtype")
SIMULATED = frozenset({"int2-weight", "int3-weight"})
"""Schemes the runtime simulates by round-tripping weights (labelled as such in every report)."""


def _load_time_group(method: str, group_size: int) -> int | None:
    return group_size if method not in ("none", "int8-weight", "int8-dynamic") else None


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
    beside_others=True,
    shares="evaluation baseline",
    purpose="Quantized or lower-precision weights keep every suite metric within its non-inferiority margin.",
)
class QuantizationGate(Gate):
    """Paired non-inferiority per suite, token agreement and mean KL, calibration identity, failure examples."""

    def run(self, ctx: GateContext) -> GateResult:
        """Compare the baseline with only its precision fields (and a toolchain checkpoint's weights) taken from
        the candidate."""
        checkpoint = ctx.candidate.weights.quantized_checkpoint
        candidate = ctx.isolated(PRECISION_FIELDS + (("weights",) if checkpoint else ()))
        quant = candidate.runtime.quantization
        scheme = served_scheme(candidate) if checkpoint else None
        measurements = QuantizationMeasurements(
            method=f"{scheme.format} {scheme.scheme}" if scheme else quant.method,
            simulated=quant.method in SIMULATED,
            group_size=scheme.group_size if scheme else _load_time_group(quant.method, quant.group_size),
            dtype=candidate.runtime.dtype,
            kv_cache_dtype=candidate.runtime.kv_cache.dtype if candidate.runtime.kv_cache else None,
            calibration=scheme.calibration if scheme else calibration_identity(candidate),
            checkpoint=CheckpointScheme.model_validate(scheme) if scheme else None,
            parent=ctx.baseline.weights.source if scheme else None,
        )
        if not ctx.candidate.quality.suites:
            return self.result(
                "warn", "no eval suites declared (quality.suites): quantization cannot be judged", measurements
            )
        comparison = compare_on_suites(ctx, ctx.baseline, candidate)
        scores, next_token = comparison.suite_scores(), next_token_report(ctx, candidate)
        measurements = measurements.updated(suites=scores, next_token=next_token)
        reason = comparison.reason()
        if measurements.simulated:
            reason = f"{reason} ({quant.method} simulated)"
        if scheme is not None:
            reason = f"{reason} ({scheme.format} {scheme.scheme} against {ctx.baseline.weights.source})"
        return self.result(comparison.verdict, reason, measurements, comparison.evidence)

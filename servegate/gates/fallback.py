"""The `fallback` gate: what answers when the primary cannot must keep the primary's contract.

Checks: the fallback declares the primary's output_schema; its outputs are as valid as the primary's
(validity metrics, paired, on every suite); its metrics stay inside the declared boundary; forced
overload and forced deadlines are routed to it, marked `fallback_used`, and no request is lost.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from servegate.contracts.errors import CATALOGUE, ServegateError
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.gates.base import Gate, GateContext, GateSetupError
from servegate.gates.comparison import QualityComparison, compare_runs
from servegate.gates.evaluation import SuiteRun, burst, generate, make_suite_data, requests_for
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult, Verdict, worst
from servegate.gates.statistics import boundary_check
from servegate.runtime.api import ErrorEvent, FinishEvent, GenerationRequest

FORCED_REQUESTS = 16


def validity_metrics(metrics: list[str]) -> list[str]:
    """Metrics that check an output contract (schema validity), as opposed to correctness."""
    return [m for m in metrics if m.endswith("_valid")]


def _valid_under(schema: dict[str, Any], text: str | None) -> float:
    if text is None:
        return 0.0
    try:
        return float(jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)))
    except ValueError:
        return 0.0


def load_fallback(served: ServedModel) -> ServedModel:
    """The fallback manifest a primary declares (its path relative to the primary's file)."""
    assert served.failure_policy.fallback is not None
    path = served.resolve_path(served.failure_policy.fallback.manifest)
    try:
        return load_manifest(path)
    except ServegateError as exc:
        raise GateSetupError(f"the fallback manifest {path} does not load: {exc}") from None


@register_gate(
    "fallback",
    watches=("failure_policy.fallback",),
    purpose="The fallback keeps the primary's output contract and its declared quality boundary, and takes over "
    "overload and deadlines without losing a request.",
)
class FallbackGate(Gate):
    """Output contract, boundary, and forced routing of the fallback model."""

    def run(self, ctx: GateContext) -> GateResult:
        """Run the contract, boundary and routing checks; the worst decides."""
        primary = ctx.candidate
        policy = primary.failure_policy.fallback
        if policy is None:
            return self.result("pass", "no fallback declared: failures end in their catalogued errors")
        fallback = load_fallback(primary)
        checks: list[tuple[Verdict, str]] = []
        measurements: dict[str, Any] = {
            "fallback": fallback.name,
            "on": list(policy.on),
            "boundary": dict(policy.boundary),
        }

        schema = primary.postprocess.output_schema
        if schema is not None and fallback.postprocess.output_schema != schema:
            checks.append(("fail", "the fallback declares a different postprocess.output_schema than the primary"))

        contract = QualityComparison()
        boundaries: dict[str, Any] = {}
        boundary_checks: list[tuple[Verdict, str]] = []
        for data in ctx.suites(primary):
            base = ctx.run_suite(ctx.baseline, data, role="baseline")
            fb = ctx.run_suite(fallback, data, role="baseline")  # cached: the fallback is its own manifest
            metrics = validity_metrics(data.suite.metrics)
            base_scores = {m: base.scores[m] for m in metrics}
            fb_scores = {m: fb.scores[m] for m in metrics}
            if schema is not None:
                base_scores["output_schema_valid"] = [_valid_under(schema, o.text) for o in base.outputs]
                fb_scores["output_schema_valid"] = [_valid_under(schema, o.text) for o in fb.outputs]
            if base_scores:
                sub = make_suite_data(
                    data.suite.model_copy(update={"metrics": list(base_scores)}), data.items, data.schema
                )
                compare_runs(
                    primary,
                    sub,
                    SuiteRun(sub, base.outputs, base_scores),
                    SuiteRun(sub, fb.outputs, fb_scores),
                    contract,
                )
            for metric, floor in policy.boundary.items():
                if metric in fb.scores:
                    check = boundary_check(
                        fb.scores[metric], floor, confidence=primary.quality.confidence, metric=metric
                    )
                    boundaries[f"{data.name}/{metric}"] = check.to_dict()
                    boundary_checks.append((check.verdict, f"{data.name}: {check.reason}"))
        if contract.tests:  # the contract first: it is what the primary's clients parse
            checks.append((contract.verdict, f"output contract: {contract.reason()}"))
        checks.extend(boundary_checks)
        measurements["contract"] = contract.measurements()["suites"]
        measurements["boundaries"] = boundaries
        unmatched = [m for m in policy.boundary if not any(k.endswith(f"/{m}") for k in boundaries)]
        if unmatched:
            checks.append(("warn", f"boundary metric(s) {', '.join(unmatched)} are computed on no suite"))

        routing = self._routing(ctx, primary, policy.on)
        measurements["routing"] = routing
        checks.extend(routing.pop("checks"))

        verdict = worst(v for v, _ in checks) if checks else "pass"
        reason = next((r for v, r in checks if v == verdict), "fallback keeps the contract and its boundary")
        if verdict == "pass":
            reason = f"contract kept, boundary met, overload/deadline routed ({len(checks)} checks)"
        return self.result(verdict, reason, measurements, contract.evidence)

    def _routing(self, ctx: GateContext, primary: ServedModel, on: list[str]) -> dict[str, Any]:
        """Force overload (a queue of 1) and deadlines (1 ms) on the primary; see who answers."""
        forced = primary.with_changes(
            failure_policy={**primary.failure_policy.model_dump(mode="python"), "max_queue": 1}
        )
        engine = ctx.engines.fresh(forced)
        suites = ctx.suites(primary)
        if not suites or not suites[0].items:
            return {"checks": [("warn", "no suite items to send as forced requests")]}
        data = suites[0]
        items = [data.items[i % len(data.items)] for i in range(FORCED_REQUESTS)]
        out: dict[str, Any] = {"checks": []}
        expiring = [
            GenerationRequest(id=f"deadline/{r.id}", prompt=r.prompt, params=r.params, timeout_s=0.001)
            for r in requests_for(data, items)
        ]
        for trigger, code, requests in (
            ("overload", "overloaded", requests_for(data, items)),
            ("timeout", "deadline_exceeded", expiring),
        ):
            ctx.progress.start(f"fallback: forced {trigger}", 1)
            results = burst(engine, requests) if trigger == "overload" else generate(engine, requests)
            ctx.progress.advance()
            routed = sum(isinstance(r, FinishEvent) and r.fallback_used for r in results)
            errors: dict[str, int] = {}
            for r in results:
                if isinstance(r, ErrorEvent):
                    errors[r.error.code] = errors.get(r.error.code, 0) + 1
            provoked = routed + errors.get(code, 0)
            out[trigger] = {
                "sent": len(requests),
                "answered": len(results),
                "routed_to_fallback": routed,
                "errors": errors,
            }
            uncatalogued = [c for c in errors if c not in CATALOGUE]
            if len(results) != len(requests) or uncatalogued:
                out["checks"].append(("fail", f"forced {trigger}: requests lost or uncatalogued errors {uncatalogued}"))
            elif provoked == 0:
                out["checks"].append(("warn", f"forced {trigger} was not provoked: every request finished normally"))
            elif trigger in on and errors.get(code, 0):
                out["checks"].append(
                    ("fail", f"{errors[code]} {code} error(s) although failure_policy.fallback.on includes {trigger}")
                )
            elif trigger not in on and routed:
                out["checks"].append(
                    ("fail", f"{routed} request(s) routed to the fallback on {trigger}, which is not declared")
                )
            else:
                out["checks"].append(("pass", f"forced {trigger}: {routed} routed, {errors.get(code, 0)} {code}"))
        return out

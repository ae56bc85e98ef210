"""The `fallback` gate: what answers when the primary cannot must keep the primary's contract.

Checks: the fallback declares the primary's output_schema; its outputs are as valid as the primary's
(validity metrics, paired, on every suite); its metrics stay inside the declared boundary; forced
overload and forced deadlines are routed to it, marked `fallback_used`, and no request is lost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jsonschema

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.errors import CATALOGUE, ServegateError
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.quality import BoundaryCheck
from servegate.contracts.report.quality_measurements import FallbackMeasurements, ForcedRouting
from servegate.gates.base import Gate, GateContext, GateSetupError
from servegate.gates.quality.comparison import QualityComparison, compare_runs
from servegate.gates.quality.statistics import boundary_check
from servegate.gates.registry import register_gate
from servegate.gates.result import GateResult, Verdict, worst
from servegate.gates.suites.evaluation import SuiteRun, burst, make_suite_data, requests_for
from servegate.runtime.types import ErrorEvent, FinishEvent

FORCED_REQUESTS = 16


def forced_count(primary: ServedModel, trigger: str) -> int:
    """Requests a forced trigger sends: on a remote, overload first fills every slot the endpoint admits.

    The endpoint backend keeps `batching.max_batch_size` requests in flight to its remote before any waits
    in its queue of 1, so a burst no larger than that finishes normally and provokes nothing.
    """
    if trigger == "overload" and primary.runtime.remote:
        return primary.batching.max_batch_size + 1 + FORCED_REQUESTS
    return FORCED_REQUESTS


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
    watches=GATE_WATCHES["fallback"],
    beside_others=True,
    shares="evaluation baseline",
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

        schema = primary.postprocess.output_schema
        if schema is not None and fallback.postprocess.output_schema != schema:
            checks.append(("fail", "the fallback declares a different postprocess.output_schema than the primary"))

        contract = QualityComparison()
        boundaries: dict[str, BoundaryCheck] = {}
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
                    boundaries[f"{data.name}/{metric}"] = check
                    boundary_checks.append((check.verdict, f"{data.name}: {check.reason}"))
        if contract.tests:  # the contract first: it is what the primary's clients parse
            checks.append((contract.verdict, f"output contract: {contract.reason()}"))
        checks.extend(boundary_checks)
        unmatched = [m for m in policy.boundary if not any(k.endswith(f"/{m}") for k in boundaries)]
        if unmatched:
            checks.append(("warn", f"boundary metric(s) {', '.join(unmatched)} are computed on no suite"))

        routing, routing_checks = self._routing(ctx, primary, policy.triggers)
        checks.extend(routing_checks)
        measurements = FallbackMeasurements(
            fallback=fallback.name,
            triggers=list(policy.triggers),
            boundary=dict(policy.boundary),
            contract=contract.suite_scores(),
            boundaries=boundaries,
            routing=routing,
        )

        verdict = worst(v for v, _ in checks) if checks else "pass"
        reason = next((r for v, r in checks if v == verdict), "fallback keeps the contract and its boundary")
        if verdict == "pass":
            reason = f"contract kept, boundary met, overload/deadline routed ({len(checks)} checks)"
        return self.result(verdict, reason, measurements, contract.evidence)

    def _routing(
        self, ctx: GateContext, primary: ServedModel, triggers: Sequence[str]
    ) -> tuple[dict[str, ForcedRouting], list[tuple[Verdict, str]]]:
        """Force overload (a queue of 1) and missed deadlines (a 1 ms request_timeout_s) on the primary.

        The deadline is the primary's manifest setting, not the requests' own, so a request handed to the
        fallback gets the fallback's deadline, as in production.
        """
        suites = ctx.suites(primary)
        if not suites or not suites[0].items:
            return {}, [("warn", "no suite items to send as forced requests")]
        data = suites[0]
        policy = primary.failure_policy.model_dump(mode="python")
        out: dict[str, ForcedRouting] = {}
        checks: list[tuple[Verdict, str]] = []
        for trigger, code, change in (
            ("overload", "overloaded", {"max_queue": 1}),
            ("timeout", "deadline_exceeded", {"request_timeout_s": 0.001}),
        ):
            ctx.progress.start(f"fallback: forced {trigger}", 1)
            engine = ctx.engines.fresh(primary.with_changes(failure_policy={**policy, **change}))
            items = [data.items[i % len(data.items)] for i in range(forced_count(primary, trigger))]
            requests = requests_for(data, items)
            delivered = burst(engine, requests)
            ctx.progress.advance()
            ended = [d for d in delivered if d is not None]
            routed = sum(isinstance(d.result, FinishEvent) and d.result.fallback_used for d in ended)
            errors: dict[str, int] = {}
            for d in ended:
                if isinstance(d.result, ErrorEvent):
                    errors[d.result.error.code] = errors.get(d.result.error.code, 0) + 1
            # once tokens reached the client, switching models would mix two outputs: the error is right then
            unrouted = sum(
                isinstance(d.result, ErrorEvent) and d.result.error.code == code and not d.streamed for d in ended
            )
            provoked = routed + errors.get(code, 0)
            out[trigger] = ForcedRouting(
                sent=len(requests),
                answered=len(ended),
                routed_to_fallback=routed,
                errors=errors,
                errors_after_first_token=errors.get(code, 0) - unrouted,
            )
            uncatalogued = [c for c in errors if c not in CATALOGUE]
            if len(ended) != len(requests) or uncatalogued:
                lost = len(requests) - len(ended)
                checks.append(("fail", f"forced {trigger}: {lost} request(s) lost, uncatalogued errors {uncatalogued}"))
            elif provoked == 0:
                checks.append(("warn", f"forced {trigger} was not provoked: every request finished normally"))
            elif trigger in triggers and unrouted:
                checks.append(
                    ("fail", f"{unrouted} {code} error(s) before any token although failure_policy.fallback.triggers "
                     f"includes {trigger}")
                )  # fmt: skip
            elif trigger not in triggers and routed:
                checks.append(
                    ("fail", f"{routed} request(s) routed to the fallback on {trigger}, which is not declared")
                )
            else:
                checks.append(("pass", f"forced {trigger}: {routed} routed, {errors.get(code, 0)} {code}"))
        return out, checks

"""Checklist item 6: the quality gate, read from a check report that has already been made public-safe.

The report's measurements are free-form per gate; the note recognises, at any depth:
- a score comparison: a dict with `difference` (or both `baseline` and `candidate` scores), optionally
  `n`, `ci` ([low, high]) or `ci_low`/`ci_high`, `margin`, `confidence`, `verdict`, `suite`, `metric`;
  the suite and metric are taken from the dict or from the keys above it;
- token agreement and KL: `token_agreement` (or `top1_agreement`) and `mean_kl` (or `kl`);
- `simulated: true`: the optimization was simulated (e.g. int2 weights round-tripped), not really run.
"""

from __future__ import annotations

from typing import Any

from servegate.contracts.diff import diff_manifests
from servegate.contracts.manifest import ServedModel
from servegate.model_cards.evidence import missing, producer
from servegate.model_cards.items_audits import output_length_rows
from servegate.model_cards.items_load import load_checks

_AGREEMENT = ("token_agreement", "top1_agreement", "top1_token_agreement")
_KL = ("mean_kl", "mean_kl_nats", "kl", "kl_mean")


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _first(d: dict[str, Any], *keys: str) -> Any:
    return next((d[k] for k in keys if k in d), None)


def _interval(d: dict[str, Any]) -> tuple[float | None, float | None]:
    ci = _first(d, "ci", "interval", "confidence_interval")
    if isinstance(ci, list | tuple) and len(ci) == 2:
        return _num(ci[0]), _num(ci[1])
    if isinstance(ci, dict):
        return _num(_first(ci, "low", "lower")), _num(_first(ci, "high", "upper"))
    return _num(_first(d, "ci_low", "lower", "low")), _num(_first(d, "ci_high", "upper", "high"))


def _walk(value: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every dict in the measurements with the keys leading to it."""
    found: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    if isinstance(value, dict):
        found.append((path, value))
        for key, item in value.items():
            found += _walk(item, (*path, str(key)))
    elif isinstance(value, list):
        for item in value:
            found += _walk(item, path)
    return found


class _Context:
    """Names that tell which path component is a suite and which a metric."""

    def __init__(self, suites: set[str], metrics: set[str]) -> None:
        self.suites, self.metrics = suites, metrics

    def suite(self, d: dict[str, Any], path: tuple[str, ...]) -> str | None:
        own = d.get("suite")
        return own if isinstance(own, str) else next((p for p in reversed(path) if p in self.suites), None)

    def metric(self, d: dict[str, Any], path: tuple[str, ...]) -> str | None:
        own = d.get("metric")
        return own if isinstance(own, str) else next((p for p in reversed(path) if p in self.metrics), None)


def score_rows(gate: dict[str, Any], ctx: _Context) -> list[dict[str, Any]]:
    """Per suite and metric: n, both scores, the difference, its interval, the margin and the verdict."""
    rows = []
    for path, d in _walk(gate.get("measurements"), ()):
        diff = _num(_first(d, "difference", "diff", "delta"))
        base, cand = _num(_first(d, "baseline", "baseline_score")), _num(_first(d, "candidate", "candidate_score"))
        if diff is None and (base is None or cand is None):
            continue
        low, high = _interval(d)
        verdict = d.get("verdict")
        if not isinstance(verdict, str):
            passed = d.get("passed", d.get("pass"))
            verdict = {True: "pass", False: "fail"}.get(passed) if isinstance(passed, bool) else None
        rows.append(
            {
                "gate": gate["name"],
                "suite": ctx.suite(d, path),
                "metric": ctx.metric(d, path) or (path[-1] if path else None),
                "n": _num(_first(d, "n", "items", "count")),
                "baseline": base,
                "candidate": cand,
                "difference": diff
                if diff is not None
                else (cand - base if cand is not None and base is not None else None),
                "ci_low": low,
                "ci_high": high,
                "confidence": _num(d.get("confidence")),
                "margin": _num(d.get("margin")),
                "verdict": verdict,
            }
        )
    return rows


def agreement_rows(gate: dict[str, Any], ctx: _Context) -> list[dict[str, Any]]:
    """Per suite: top-1 token agreement and mean KL between baseline and candidate next-token distributions."""
    rows = []
    for path, d in _walk(gate.get("measurements"), ()):
        agreement, kl = _num(_first(d, *_AGREEMENT)), _num(_first(d, *_KL))
        if agreement is None and kl is None:
            continue
        rows.append({"gate": gate["name"], "suite": ctx.suite(d, path), "token_agreement": agreement, "mean_kl": kl})
    return rows


def simulated(gate: dict[str, Any]) -> bool | None:
    """True when the gate reports a simulated optimization, False when it says not, None when it does not say."""
    flags = [d["simulated"] for _, d in _walk(gate.get("measurements"), ()) if isinstance(d.get("simulated"), bool)]
    return any(flags) if flags else None


def optimizations(served: ServedModel, gates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every field where the served model differs from its reference form, the gates watching it, and whether
    the gate that measured it says it was simulated."""
    by_name = {g["name"]: g for g in gates}
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
                "verdicts": {g: by_name[g]["verdict"] for g in watching},
                "simulated": True if True in flags else (False if False in flags else None),
            }
        )
    return rows


def quality_gate(served: ServedModel, report: dict[str, Any] | None, public_suites: set[str]) -> dict[str, Any]:
    """Item 6: each gate's verdict, metrics with intervals and margins, failure-example counts, simulated parts.

    `report` must already be public-safe (PublicFilter.report); only public failure examples are listed.
    """
    if report is None:
        raise missing("quality gate", f"run `{producer('report')}` and pass --report check.json")
    if not report.get("gates"):
        raise missing("quality gate", f"the check report has no gates: rerun `{producer('report')}`")
    ctx = _Context(
        suites=set(public_suites),
        metrics={m for s in served.quality.suites for m in s.metrics},
    )
    gates, scores, agreement, examples = [], [], [], []
    for gate in report["gates"]:
        evidence = gate.get("evidence") or []
        public = [e for e in evidence if e.get("suite") in public_suites]
        gates.append(
            {
                "name": gate["name"],
                "verdict": gate["verdict"],
                "reason": gate["reason"],
                "failure_examples": len(evidence),
                "public_failure_examples": len(public),
                "simulated": simulated(gate),
            }
        )
        scores += score_rows(gate, ctx)
        agreement += agreement_rows(gate, ctx)
        examples += [{"gate": gate["name"], **e} for e in public[: served.quality.max_failure_examples]]
    return {
        "verdict": report["verdict"],
        "mode": report.get("mode"),
        "confidence": served.quality.confidence,
        "margins": {**{"default": served.quality.default_margin}, **served.quality.margins},
        "gates": gates,
        "scores": scores,
        "agreement": agreement,
        "output_length": output_length_rows(report["gates"]),
        "optimizations": optimizations(served, report["gates"]),
        "examples": examples,
        "under_load": load_checks(report),
    }
